"""Errors the sandbox raises to its callers (not the per-call errors, which are results)."""

from __future__ import annotations


class SandboxError(Exception):
    """Something went wrong running code, outside any single evaluation call."""


class SandboxUnavailable(SandboxError):
    """The configured runner cannot run here (bwrap or libseccomp missing, user namespaces off).

    Never caught to fall back to a weaker runner: an operator has to choose ``inprocess``.
    """

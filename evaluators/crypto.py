"""Encryption at rest for model-connection API keys (Fernet: AES-128-CBC + HMAC-SHA256), used
by ``ModelConnection.set_api_key`` and ``ModelConnection.api_key``.

The Fernet key is derived with HKDF-SHA256 from ``EVALSITE_ENCRYPTION_KEY`` when it is set, else
from ``SECRET_KEY``. Encrypting always uses the first key; decrypting tries ``EVALSITE_ENCRYPTION_KEY``,
then ``SECRET_KEY``, then every ``SECRET_KEY_FALLBACKS`` entry, so either secret can be rotated:
set the new one, keep the old one as a fallback, re-save the connections.
"""

from __future__ import annotations

import base64
import functools

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

_INFO = b"evalsite model-connection api keys v1"


class UndecryptableKey(Exception):
    """The stored key was encrypted with a secret this server no longer has."""


def _derive(secret: str) -> Fernet:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"evalsite", info=_INFO)
    return Fernet(base64.urlsafe_b64encode(hkdf.derive(secret.encode())))


@functools.cache
def _fernet(secrets: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([_derive(secret) for secret in secrets])


def _current() -> MultiFernet:
    dedicated = settings.EVALSITE_ENCRYPTION_KEY
    secrets = [dedicated] if dedicated else []
    secrets += [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    return _fernet(tuple(dict.fromkeys(secrets)))


def encrypt(text: str) -> str:
    return _current().encrypt(text.encode()).decode("ascii")


def decrypt(token: str) -> str:
    try:
        return _current().decrypt(token.encode("ascii")).decode()
    except InvalidToken:
        raise UndecryptableKey(
            "The stored API key cannot be decrypted with this server's secret (was "
            "EVALSITE_ENCRYPTION_KEY or SECRET_KEY changed?). Enter the key again."
        )

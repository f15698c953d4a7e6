"""Tenancy: projects, memberships with roles, and API keys."""

from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone


class Role(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    EDITOR = "editor", "Editor"
    OWNER = "owner", "Owner"


ROLE_RANK = {Role.VIEWER: 1, Role.EDITOR: 2, Role.OWNER: 3}


def role_allows(role: str | None, needed: str) -> bool:
    return role is not None and ROLE_RANK[Role(role)] >= ROLE_RANK[Role(needed)]


MAX_RETENTION_DAYS = 36500


class ProjectQuerySet(models.QuerySet):
    def for_user(self, user) -> ProjectQuerySet:
        if not user.is_authenticated:
            return self.none()
        return self.filter(memberships__user=user)


class Project(models.Model):
    """The tenant: every evaluator, testset, trace and run belongs to exactly one project."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    max_run_cost_usd = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        help_text="Spend cap of one run in this project: runs projected over it are refused.",
    )
    trace_retention_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_RETENTION_DAYS)],
        help_text="Whole days (plus today) its traces are kept; empty: the site's "
        "EVALSITE_TRACE_RETENTION_DAYS.",
    )
    created_at = models.DateTimeField(default=timezone.now)

    objects = ProjectQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def trace_retention_effective_days(self) -> int | None:
        """The days its traces are kept: its own setting, else the site's (None: forever)."""
        if self.trace_retention_days is not None:
            return self.trace_retention_days
        return settings.EVALSITE_TRACE_RETENTION_DAYS or None

    def role_of(self, user) -> str | None:
        if not user.is_authenticated:
            return None
        membership = self.memberships.filter(user=user).first()
        return membership.role if membership else None


class Membership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.EDITOR)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_unique_user")
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


KEY_PREFIX = "es"


def hash_key(raw_key: str) -> str:
    # Keys carry 256 bits of randomness, so a fast hash is enough: nothing to brute-force.
    return hashlib.sha256(raw_key.encode()).hexdigest()


class ApiKeyQuerySet(models.QuerySet):
    def active(self) -> ApiKeyQuerySet:
        return self.filter(revoked_at__isnull=True)


class ApiKey(models.Model):
    """A bearer key for one project. Only its hash is stored; the key is shown once."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.EDITOR)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    key_hash = models.CharField(max_length=64, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL
    )
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiKeyQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({KEY_PREFIX}_{self.prefix}_…)"

    @classmethod
    def generate(cls) -> tuple[str, str, str]:
        """Return (raw key, prefix, hash). The raw key is never stored."""
        prefix = secrets.token_hex(4)
        raw = f"{KEY_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
        return raw, prefix, hash_key(raw)

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    def revoke(self) -> None:
        if self.revoked_at is None:
            self.revoked_at = timezone.now()
            self.save(update_fields=["revoked_at"])

    def touch(self) -> None:
        """Record use, at most once a minute, so a busy key does not write on every request."""
        now = timezone.now()
        stale_before = now - timedelta(seconds=settings.API_KEY_TOUCH_INTERVAL_SECONDS)
        if self.last_used_at is None or self.last_used_at < stale_before:
            ApiKey.objects.filter(pk=self.pk).update(last_used_at=now)
            self.last_used_at = now

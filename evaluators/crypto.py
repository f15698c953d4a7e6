"""Secrets at rest: model-connection API keys and sealed settings (the header values of webhook
evaluators and HTTP applications). Fernet (AES-128-CBC + HMAC-SHA256) through MultiFernet.

Keys: ``EVALSITE_ENCRYPTION_KEY`` holds one or more secrets, comma-separated, newest first; each
is stretched into a Fernet key with HKDF-SHA256. Encrypting uses the first. Decrypting tries
every one, then ``SECRET_KEY`` and ``SECRET_KEY_FALLBACKS`` (what sealed values before a
dedicated key was set). Without ``EVALSITE_ENCRYPTION_KEY`` the first key is ``SECRET_KEY``,
which settings never leave predictable (a random one kept in the data folder). The
``rotate_encryption_key`` command re-encrypts everything under the first key.

A sealed value is stored as ``"sealed:<token>"``, so a stored value says what it is. People never
see it: every page, API response and admin page shows :data:`MASK` instead, and a value sent back
as :data:`MASK` keeps the stored one (docs/security.md, "secrets boundary").
"""

from __future__ import annotations

import base64
import functools
import re

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

from evalsite.errors import InvalidInput

_INFO = b"evalsite model-connection api keys v1"
SEALED = "sealed:"
# What a sealed value reads as. Not ASCII, so it can never be a real header value.
MASK = "••••••"
# What an HTTP client sends as a header value without complaint: visible ASCII, inner spaces.
_HEADER_VALUE = re.compile(r"([\x21-\x7e]([\x20-\x7e]*[\x21-\x7e])?)?")


class UndecryptableKey(Exception):
    """The stored secret was encrypted with a key this server no longer has."""


def _derive(secret: str) -> Fernet:
    hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"evalsite", info=_INFO)
    return Fernet(base64.urlsafe_b64encode(hkdf.derive(secret.encode())))


@functools.cache
def _fernet(secrets: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([_derive(secret) for secret in secrets])


def encryption_keys() -> list[str]:
    """The configured secrets, the one that encrypts first."""
    dedicated = settings.EVALSITE_ENCRYPTION_KEY
    if isinstance(dedicated, str):
        dedicated = dedicated.split(",")
    secrets = [key.strip() for key in dedicated if key.strip()]
    secrets += [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    return list(dict.fromkeys(secrets))


def _current() -> MultiFernet:
    return _fernet(tuple(encryption_keys()))


def encrypt(text: str) -> str:
    return _current().encrypt(text.encode()).decode("ascii")


def decrypt(
    token: str, *, what: str = "The stored API key", fix: str = "Enter the key again."
) -> str:
    try:
        return _current().decrypt(token.encode("ascii")).decode()
    except InvalidToken:
        raise UndecryptableKey(
            f"{what} cannot be decrypted with this server's keys (was EVALSITE_ENCRYPTION_KEY "
            f"or SECRET_KEY changed?). {fix}"
        )


def rotate(token: str) -> str:
    """The same secret encrypted under the first key. Raises ``UndecryptableKey``."""
    try:
        return _current().rotate(token.encode("ascii")).decode("ascii")
    except InvalidToken:
        raise UndecryptableKey("No configured key decrypts this value.")


# --- sealed values ------------------------------------------------------------------------------


def seal(text: str) -> str:
    return SEALED + encrypt(text)


def is_sealed(value: object) -> bool:
    return isinstance(value, str) and value.startswith(SEALED)


def unseal(value: str, *, what: str = "A stored secret") -> str:
    """The plain value of a sealed one; a value that was never sealed is returned as it is."""
    if not is_sealed(value):
        return value
    return decrypt(value.removeprefix(SEALED), what=what, fix="Enter the value again.")


def reseal(value: str) -> str:
    """A sealed value re-encrypted under the first key (a plain one gets sealed)."""
    return SEALED + rotate(value.removeprefix(SEALED)) if is_sealed(value) else seal(value)


def secrets_seal(new: dict[str, str], stored: dict[str, str], *, field: str) -> dict[str, str]:
    """Seal a name -> value map of secrets sent by a person, against the stored (sealed) map.

    A value that is :data:`MASK`, the stored value itself, or the stored value's plain text
    keeps the stored ciphertext (so an unchanged secret makes no new revision); any other value
    is sealed afresh; a name left out is removed. Names match case-insensitively, as HTTP
    headers do. ``field`` names the setting in the error for a MASK with nothing stored.
    """
    by_name = {name.lower(): value for name, value in stored.items() if is_sealed(value)}
    sealed = {}
    for name, value in new.items():
        old = by_name.get(name.lower())
        if value == MASK and old is None:
            raise InvalidInput(
                {field: [f"{name}: {MASK} stands for a stored value, and none is stored; give it."]}
            )
        if old is not None and value in (MASK, old, _plain(old)):
            sealed[name] = old
        elif not _HEADER_VALUE.fullmatch(value):
            # Refused here: the HTTP client's error would quote the value to everyone.
            raise InvalidInput(
                {
                    field: [
                        f"the value of {name} may hold only printable ASCII, without spaces at "
                        f"either end"
                    ]
                }
            )
        else:
            sealed[name] = seal(value)
    return sealed


def _plain(value: str) -> str | None:
    try:
        return unseal(value)
    except UndecryptableKey:
        return None


def secrets_unseal(values: dict[str, str], *, what: str = "A stored header value") -> dict:
    """The plain values, for the one place that sends them. Raises ``UndecryptableKey``."""
    return {name: unseal(value, what=f"{what} ({name})") for name, value in values.items()}


def secrets_mask(values: dict[str, str]) -> dict[str, str]:
    """What people see of a secrets map: every name, no value."""
    return dict.fromkeys(values, MASK)

"""API token secrets: how they look, and how they are hashed for storage."""

from __future__ import annotations

import hashlib
import secrets

SECRET_PREFIX = "spur_"
DISPLAY_PREFIX_LENGTH = len(SECRET_PREFIX) + 8


def generate_secret() -> str:
    """`spur_` and 43 URL-safe characters (256 random bits)."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def display_prefix(secret: str) -> str:
    return secret[:DISPLAY_PREFIX_LENGTH]


def looks_like_secret(value: str) -> bool:
    return value.startswith(SECRET_PREFIX) and len(value) > len(SECRET_PREFIX)

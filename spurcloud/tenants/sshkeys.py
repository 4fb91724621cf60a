"""SSH public keys as people paste them (`ssh-ed25519 AAAA... laptop`): parsed and
checked by `cryptography`'s OpenSSH reader, refused unless of a type and size we accept,
and brought to one canonical line with OpenSSH's SHA256 fingerprint.

Accepted: Ed25519, ECDSA (NIST P-256, P-384, P-521) and RSA of 2048 bits or more. DSA is
refused (OpenSSH itself dropped it), and so is RSA under 2048 bits (NIST SP 800-131A)."""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_ssh_public_key

MIN_RSA_BITS = 2048
# A 16384-bit RSA key's line is about 2.8 KB; nothing we accept is longer.
MAX_KEY_LINE = 4096
MAX_COMMENT = 100
ECDSA_TYPES = {
    "ecdsa-sha2-nistp256": ec.SECP256R1,
    "ecdsa-sha2-nistp384": ec.SECP384R1,
    "ecdsa-sha2-nistp521": ec.SECP521R1,
}
ACCEPTED_TYPES = ("ssh-ed25519", *ECDSA_TYPES, "ssh-rsa")


class InvalidSshKey(ValueError):
    pass


@dataclass(frozen=True)
class SshPublicKey:
    key_type: str
    blob: str  # base64, as in the line
    comment: str
    bits: int

    @property
    def line(self) -> str:
        """The key as authorized_keys holds it (type and key, without the comment)."""
        return f"{self.key_type} {self.blob}"

    @property
    def fingerprint(self) -> str:
        """As `ssh-keygen -lf` prints it: SHA256 of the key, base64 without padding."""
        digest = hashlib.sha256(base64.b64decode(self.blob)).digest()
        return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def parse_public_key(text: str) -> SshPublicKey:
    """One public key line (`<type> <base64> [comment]`), or InvalidSshKey saying why."""
    text = text.strip()
    if not text:
        raise InvalidSshKey("Paste a public key: a line such as ssh-ed25519 AAAA... you@laptop.")
    if len(text) > MAX_KEY_LINE:
        raise InvalidSshKey(f"A public key line is at most {MAX_KEY_LINE} characters.")
    if "\n" in text or "\r" in text:
        raise InvalidSshKey("Paste one key, on one line.")
    if "PRIVATE KEY" in text:
        raise InvalidSshKey(
            "That is a private key: never share it. Paste the .pub file's line instead."
        )
    parts = text.split(None, 2)
    key_type = parts[0]
    if key_type not in ACCEPTED_TYPES:
        raise InvalidSshKey(
            f"Key type {key_type[:40]!r} is not accepted: use ssh-ed25519, ecdsa-sha2-nistp256/"
            f"384/521, or ssh-rsa of {MIN_RSA_BITS} bits or more."
        )
    if len(parts) < 2:
        raise InvalidSshKey("The key's base64 part is missing.")
    blob, comment = parts[1], (parts[2].strip() if len(parts) > 2 else "")
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidSshKey("The key's base64 part is not valid base64.") from None
    # The blob names its own type first; a line whose label and blob disagree is refused.
    name = key_type.encode()
    if int.from_bytes(raw[:4], "big") != len(name) or raw[4 : 4 + len(name)] != name:
        raise InvalidSshKey(f"The key's data is not a {key_type} key.")
    try:
        key = load_ssh_public_key(f"{key_type} {blob}".encode())
    except (ValueError, TypeError) as exc:
        raise InvalidSshKey(f"The key could not be read: {exc}") from None
    if isinstance(key, rsa.RSAPublicKey):
        bits = key.key_size
        if bits < MIN_RSA_BITS:
            raise InvalidSshKey(
                f"This RSA key has {bits} bits: at least {MIN_RSA_BITS} are needed "
                "(or use ssh-ed25519)."
            )
    elif isinstance(key, ed25519.Ed25519PublicKey):
        bits = 256
    elif isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ECDSA_TYPES.get(key_type, ())):
            raise InvalidSshKey(f"The key's curve does not match {key_type}.")
        bits = key.curve.key_size
    else:  # pragma: no cover - the type check above lets no other kind through
        raise InvalidSshKey(f"Key type {key_type} is not accepted.")
    if not comment.isprintable():
        raise InvalidSshKey("The key's comment must be printable text.")
    return SshPublicKey(key_type=key_type, blob=blob, comment=comment[:MAX_COMMENT], bits=bits)

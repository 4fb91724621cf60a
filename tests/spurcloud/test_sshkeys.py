"""SSH public keys as pasted (spurcloud/tenants/sshkeys.py): the types and sizes we take,
fingerprints as ssh-keygen prints them, and a clear refusal for everything else."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed25519, rsa
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from spurcloud.tenants.sshkeys import InvalidSshKey, parse_public_key


def openssh_line(key: object, comment: str = "me@laptop") -> str:
    public = key.public_key()  # type: ignore[attr-defined]
    return public.public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode() + f" {comment}"


ED25519 = openssh_line(ed25519.Ed25519PrivateKey.generate())


@pytest.mark.parametrize(
    ("key", "key_type", "bits"),
    [
        (ed25519.Ed25519PrivateKey.generate(), "ssh-ed25519", 256),
        (ec.generate_private_key(ec.SECP256R1()), "ecdsa-sha2-nistp256", 256),
        (ec.generate_private_key(ec.SECP384R1()), "ecdsa-sha2-nistp384", 384),
        (ec.generate_private_key(ec.SECP521R1()), "ecdsa-sha2-nistp521", 521),
        (rsa.generate_private_key(public_exponent=65537, key_size=2048), "ssh-rsa", 2048),
    ],
)
def test_it_accepts_ed25519_ecdsa_and_rsa_of_2048_bits(key: object, key_type: str, bits: int):
    parsed = parse_public_key("  " + openssh_line(key) + "\n")
    assert (parsed.key_type, parsed.bits, parsed.comment) == (key_type, bits, "me@laptop")
    assert parsed.line == openssh_line(key).rsplit(" ", 1)[0]


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")
def test_the_fingerprint_is_the_one_ssh_keygen_prints(tmp_path: Path) -> None:
    path = tmp_path / "key.pub"
    path.write_text(ED25519 + "\n")
    printed = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()[1]
    assert parse_public_key(ED25519).fingerprint == printed


def _blob_of(line: str) -> str:
    return line.split()[1]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "Paste a public key"),
        (openssh_line(rsa.generate_private_key(public_exponent=65537, key_size=1024)), "1024 bits"),
        (openssh_line(dsa.generate_private_key(key_size=1024)), "'ssh-dss' is not accepted"),
        ("-----BEGIN OPENSSH PRIVATE KEY----- abc", "That is a private key"),
        ("ssh-ed25519", "base64 part is missing"),
        ("ssh-ed25519 !!!notbase64", "not valid base64"),
        # The label says ed25519; the data is an RSA key's.
        (
            "ssh-ed25519 "
            + _blob_of(
                openssh_line(rsa.generate_private_key(public_exponent=65537, key_size=2048))
            ),
            "not a ssh-ed25519 key",
        ),
        ("ssh-ed25519 " + base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00").decode(), "read"),
        (ED25519 + "\n" + ED25519, "one key, on one line"),
        ("ssh-ed25519 " + "A" * 5000, "at most 4096"),
    ],
)
def test_it_refuses_other_keys_and_says_why(text: str, why: str) -> None:
    with pytest.raises(InvalidSshKey, match=why):
        parse_public_key(text)

"""A release's signature, checked on the host with the stack's public key: standard library only.

Each stack has an asymmetric KMS key (ECC_NIST_P256, SIGN_VERIFY) that only its deploy role may sign
with. At build the toolkit signs one short statement naming the stack, the release id and the
sha256 of the release's ``release.json`` (which lists the artifact digest, every rendered file's
hash and the SBOM's); the signature travels beside it as ``release.sig``. A host checks it before
``current`` may point at the release, with the public key its provisioning wrote to its
file (``<root>/release-key.pub``: ``kms:GetPublicKey``'s DER SubjectPublicKeyInfo, base64): no call to KMS, no credentials, no
package — a pure-Python ECDSA P-256 verify, some 20 ms, in place of ``openssl`` that a closed host
image may lack and whose output would have to be parsed. Verifying needs no secret, so being slow
and not constant-time costs nothing here.

The statement, not ``release.json`` itself, is what KMS signs: KMS signs at most 4096 bytes of raw
message, and a release of many files could pass that.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass

#: ``release.sig`` beside ``release.json`` in every release directory and in the history bucket.
SIGNATURE_NAME = "release.sig"
#: ``<root>/release-key.pub``: the stack's public key (base64 DER), written at provisioning.
RELEASE_KEY_NAME = "release-key.pub"
ALGORITHM = "ECDSA_SHA_256"
STATEMENT_PREFIX = "frontier-release/1"

# NIST P-256 (FIPS 186-4 D.1.2.3).
_P = 0xFFFFFFFF00000001000000000000000000000000FFFFFFFFFFFFFFFFFFFFFFFF
_A = _P - 3
_B = 0x5AC635D8AA3A93E7B3EBBD55769886BC651D06B0CC53B0F63BCE3C3E27D2604B
_N = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551
_G = (
    0x6B17D1F2E12C4247F8BCE6E563A440F277037D812DEB33A0F4A13945D898C296,
    0x4FE342E2FE1A7F9B8EE7EB4A7C0F9E162BCE33576B315ECECBB6406837BF51F5,
)
# DER of the OIDs id-ecPublicKey (1.2.840.10045.2.1) and prime256v1 (1.2.840.10045.3.1.7).
_EC_PUBLIC_KEY = bytes.fromhex("2a8648ce3d0201")
_PRIME256V1 = bytes.fromhex("2a8648ce3d030107")


class SignatureError(Exception):
    """A release whose signature is missing, malformed, by another key, or not over these bytes."""


@dataclass(frozen=True)
class ReleaseSignature:
    """``release.sig``: which key signed (its ARN, for the message), how, and the DER signature."""

    key_id: str
    algorithm: str
    signature: bytes

    def to_json(self) -> str:
        data = {
            "algorithm": self.algorithm,
            "key_id": self.key_id,
            "signature": base64.b64encode(self.signature).decode(),
        }
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ReleaseSignature:
        try:
            data = json.loads(text)
            return cls(
                key_id=str(data["key_id"]),
                algorithm=str(data["algorithm"]),
                signature=base64.b64decode(data["signature"], validate=True),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise SignatureError(f"{SIGNATURE_NAME} is malformed ({type(exc).__name__}: {exc})") from None


def release_key_alias(stack: str) -> str:
    """The KMS alias of ``stack``'s release key: the toolkit, the Pulumi program and hosts all name it so."""
    return f"alias/frontier-{stack}-release"


def statement(stack: str, release_id: str, manifest: bytes) -> bytes:
    """The bytes KMS signs for a release: its stack, its id and its ``release.json``'s sha256."""
    return f"{STATEMENT_PREFIX} {stack} {release_id} sha256:{hashlib.sha256(manifest).hexdigest()}\n".encode()


def verify_release(
    public_key_b64: str, stack: str, release_id: str, manifest: bytes, signature_text: str
) -> None:
    """Raise :class:`SignatureError` unless ``signature_text`` signs this release with the key."""
    sig = ReleaseSignature.from_json(signature_text)
    if sig.algorithm != ALGORITHM:
        raise SignatureError(
            f"{SIGNATURE_NAME}: algorithm {sig.algorithm!r}, the stack's key signs {ALGORITHM}"
        )
    point = public_key_point(public_key_b64)
    if not ecdsa_p256_verify(point, statement(stack, release_id, manifest), sig.signature):
        raise SignatureError(
            f"release {release_id}: {SIGNATURE_NAME} does not verify with stack {stack}'s release key "
            f"(signed by {sig.key_id or 'an unnamed key'} or altered after signing)"
        )


# --- DER, as far as a P-256 key and an ECDSA signature need it --------------------------------------


def _der(data: bytes, pos: int, tag: int) -> tuple[bytes, int]:
    """The value of the DER element of ``tag`` at ``pos``, and the position after it."""
    if pos + 2 > len(data) or data[pos] != tag:
        raise SignatureError(f"DER: expected tag 0x{tag:02x} at byte {pos}")
    length, pos = data[pos + 1], pos + 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or count > 2 or pos + count > len(data):
            raise SignatureError("DER: bad length")
        length, pos = int.from_bytes(data[pos : pos + count], "big"), pos + count
    if pos + length > len(data):
        raise SignatureError("DER: element runs past the end")
    return data[pos : pos + length], pos + length


def public_key_point(public_key_b64: str) -> tuple[int, int]:
    """The curve point of a base64 DER SubjectPublicKeyInfo of a P-256 key (KMS's GetPublicKey)."""
    try:
        der = base64.b64decode(public_key_b64, validate=True)
    except ValueError as exc:
        raise SignatureError(f"the release public key is not base64 ({exc})") from None
    spki, _ = _der(der, 0, 0x30)
    algorithm, pos = _der(spki, 0, 0x30)
    bits, _ = _der(spki, pos, 0x03)
    oid, after = _der(algorithm, 0, 0x06)
    curve, _ = _der(algorithm, after, 0x06)
    if oid != _EC_PUBLIC_KEY or curve != _PRIME256V1:
        raise SignatureError("the release public key is not an ECC_NIST_P256 key")
    if len(bits) != 66 or bits[0] != 0 or bits[1] != 4:
        raise SignatureError("the release public key is not an uncompressed P-256 point")
    point = (int.from_bytes(bits[2:34], "big"), int.from_bytes(bits[34:66], "big"))
    x, y = point
    if not (0 <= x < _P and 0 <= y < _P) or (y * y - x * x * x - _A * x - _B) % _P:
        raise SignatureError("the release public key's point is not on P-256")
    return point


def _signature_numbers(signature: bytes) -> tuple[int, int]:
    body, end = _der(signature, 0, 0x30)
    if end != len(signature):
        raise SignatureError("DER: bytes after the signature")
    r, pos = _der(body, 0, 0x02)
    s, pos = _der(body, pos, 0x02)
    if pos != len(body):
        raise SignatureError("DER: bytes after the signature's numbers")
    return int.from_bytes(r, "big"), int.from_bytes(s, "big")


# --- the curve (Jacobian coordinates: one inversion per verify) -------------------------------------

# Points (x, y, z) in Jacobian coordinates; annotations only (the agent runs on Python 3.8).
_INFINITY: tuple[int, int, int] = (0, 1, 0)


def _double(p: tuple[int, int, int]) -> tuple[int, int, int]:
    x, y, z = p
    if z == 0 or y == 0:
        return _INFINITY
    yy = y * y % _P
    s = 4 * x * yy % _P
    zz = z * z % _P
    m = 3 * (x - zz) * (x + zz) % _P  # a = -3
    x3 = (m * m - 2 * s) % _P
    return x3, (m * (s - x3) - 8 * yy * yy) % _P, 2 * y * z % _P


def _add(p: tuple[int, int, int], q: tuple[int, int, int]) -> tuple[int, int, int]:
    if p[2] == 0:
        return q
    if q[2] == 0:
        return p
    x1, y1, z1 = p
    x2, y2, z2 = q
    z1z1, z2z2 = z1 * z1 % _P, z2 * z2 % _P
    u1, u2 = x1 * z2z2 % _P, x2 * z1z1 % _P
    s1, s2 = y1 * z2 * z2z2 % _P, y2 * z1 * z1z1 % _P
    if u1 == u2:
        return _double(p) if s1 == s2 else _INFINITY
    h, r = (u2 - u1) % _P, (s2 - s1) % _P
    hh = h * h % _P
    hhh = h * hh % _P
    v = u1 * hh % _P
    x3 = (r * r - hhh - 2 * v) % _P
    return x3, (r * (v - x3) - s1 * hhh) % _P, h * z1 * z2 % _P


def ecdsa_p256_verify(point: tuple[int, int], message: bytes, signature: bytes) -> bool:
    """ECDSA over SHA-256 on P-256 (FIPS 186-4 6.4.2), the DER signature KMS's Sign returns."""
    try:
        r, s = _signature_numbers(signature)
    except SignatureError:
        return False
    if not (1 <= r < _N and 1 <= s < _N):
        return False
    e = int.from_bytes(hashlib.sha256(message).digest(), "big")
    w = pow(s, -1, _N)
    u1, u2 = e * w % _N, r * w % _N
    # Shamir's trick: u1*G + u2*Q in one pass over the bits.
    g, q = (*_G, 1), (*point, 1)
    both = _add(g, q)
    acc = _INFINITY
    for bit in range(max(u1.bit_length(), u2.bit_length()) - 1, -1, -1):
        acc = _double(acc)
        pick = ((u1 >> bit) & 1, (u2 >> bit) & 1)
        if pick == (1, 1):
            acc = _add(acc, both)
        elif pick == (1, 0):
            acc = _add(acc, g)
        elif pick == (0, 1):
            acc = _add(acc, q)
    x, _, z = acc
    if z == 0:
        return False
    affine_x = x * pow(z * z % _P, -1, _P) % _P
    return affine_x % _N == r

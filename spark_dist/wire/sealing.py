"""Sealing: what spark_dist sends where a network peer may read it (the run's store, a lane's store, the
first task's verdict under Spark Connect) is encrypted and authenticated with an AEAD cipher, AES-256-GCM from
the ``cryptography`` package, never a cipher of our own.

Every key is derived from one random secret (an attempt's, a lane's) with HKDF-SHA256, one key per purpose, so
no two uses share a key:

- the value key seals each value, with a fresh 96-bit random nonce per value and the value's label (the store
  key it is written under) as associated data: a sealed value copied under another key does not open;
- the key id (8 bytes) leads every sealed value, so a value sealed under another secret (an earlier attempt's)
  is told apart before any decryption is tried;
- the key prefix's random part (:func:`prefix_token`) puts every key of a run where no one who lacks the secret
  can name it: the run id, shown in the Spark UI, is not enough;
- a lane run's secret (:func:`lane_run_secret`) is derived on both sides from the lane's, so it never travels.

A sealed value is ``VERSION (1 byte) | key id (8) | nonce (12) | ciphertext and tag``. ``open_sealed`` returns
``None`` for anything else, unread: a forged, moved, truncated or replayed-under-another-key value.
"""
from __future__ import annotations

import hmac
import os
from typing import Optional

VERSION = b"\x01"
_KEY_ID_BYTES = 8
_NONCE_BYTES = 12
_HEADER = len(VERSION) + _KEY_ID_BYTES + _NONCE_BYTES


def derive(secret: bytes, purpose: str, length: int = 32) -> bytes:
    """A key of ``length`` bytes for ``purpose`` from ``secret`` (HKDF-SHA256, ``purpose`` as its info)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None,
                info=f"spark_dist/{purpose}".encode()).derive(secret)


def prefix_token(secret: bytes) -> str:
    """The random part of a store's key prefix: 32 hex digits derived from ``secret``, shown nowhere."""
    return derive(secret, "key prefix", 16).hex()


def lane_run_secret(lane_secret: bytes, run_id: str, attempt: int) -> bytes:
    """The secret of attempt ``attempt`` of run ``run_id`` served on a lane whose secret is ``lane_secret``:
    the driver and the lane's tasks each derive it, so it is never sent."""
    return derive(lane_secret, f"lane run/{run_id}/{attempt}")


class Sealer:
    """Seals and opens values under one secret (see the module docstring)."""

    def __init__(self, secret: bytes):
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if len(secret) < 16:
            raise ValueError("a sealing secret must hold at least 16 random bytes")
        self._aead = AESGCM(derive(secret, "value key"))
        self._invalid_tag = InvalidTag
        self.key_id = derive(secret, "key id", _KEY_ID_BYTES)

    def seal(self, label: str, data: bytes) -> bytes:
        """``data`` encrypted and authenticated, bound to ``label`` (the store key it is written under)."""
        nonce = os.urandom(_NONCE_BYTES)
        return VERSION + self.key_id + nonce + self._aead.encrypt(nonce, data, label.encode())

    def open_sealed(self, label: str, blob: bytes) -> Optional[bytes]:
        """The data sealed in ``blob`` under ``label`` with this secret, else ``None`` (nothing of it is read)."""
        if len(blob) <= _HEADER or blob[:1] != VERSION:
            return None
        if not hmac.compare_digest(blob[1:1 + _KEY_ID_BYTES], self.key_id):
            return None
        nonce = blob[1 + _KEY_ID_BYTES:_HEADER]
        try:
            return self._aead.decrypt(nonce, blob[_HEADER:], label.encode())
        except self._invalid_tag:
            return None

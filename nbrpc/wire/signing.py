"""Every message a member sends is signed, and checked before it is unpickled.

A pickle starts with a MAC of its bytes under the cluster's key (``set_key``; the driver
makes one, its workers get it with their settings), and ``check`` refuses a message
without a valid one before anything is unpickled: TensorPipe and the store accept
connections from any local user, and an RPC pickle runs code in the receiver. The MAC
is keyed BLAKE2b, which is built into Python: HMAC-SHA256 through OpenSSL 3 looks its
digest up by name on every call, which cost more than the rest of a small call's
pickling.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import pickle

from ..recording import recorder

SIGNED = b"nbrpc-blake2b:"
MAC_SIZE = 32
HEADER_SIZE = len(SIGNED) + MAC_SIZE


class _Key:
    """This process's signing key (None: unsigned), and BLAKE2b keyed with it, which each
    MAC copies: keying it again for every message cost it half as much again."""

    def __init__(self):
        self.key: bytes | None = None
        self.keyed = None


KEY = _Key()


def set_key(key: bytes | None) -> None:
    """Sign what this process sends, and accept only what is signed, with ``key``
    (at most 64 bytes)."""
    KEY.key = key
    KEY.keyed = None if key is None else hashlib.blake2b(key=key, digest_size=MAC_SIZE)


def mac(body) -> bytes:
    """``body``'s MAC under this process's key (which it must have)."""
    return _mac(KEY.keyed, body)


def _mac(keyed, body) -> bytes:
    keyed = keyed.copy()  # (the keyed state is never updated: threads copy it at once)
    keyed.update(body)
    return keyed.digest()


def signed(body) -> bytes:
    """``body`` (bytes or a buffer of them) as sent: after its MAC if this process signs."""
    keyed = KEY.keyed
    if keyed is None:
        return bytes(body)
    return b"".join((SIGNED, _mac(keyed, body), body))


def message(obj, body, tensors: list | None = None) -> bytes:
    """``body``, ``obj``'s pickle, as the message sent with ``tensors``: signed, and
    counted if calls are recorded."""
    payload = signed(body)
    if recorder.RECORDER.armed:
        recorder.count(obj, len(payload), tensors)
    return payload


def check(file: io.BytesIO) -> None:
    """Read ``file``'s signature, where this process has a key, and refuse it unless valid."""
    keyed = KEY.keyed
    if keyed is None:
        return
    header = file.read(HEADER_SIZE)  # one comparison of the whole header: the prefix is no secret
    if not hmac.compare_digest(header, SIGNED + _mac(keyed, file.getbuffer()[HEADER_SIZE:])):
        raise pickle.UnpicklingError(
            "nbrpc refused an RPC message not signed with this cluster's key: it "
            "comes from a process outside the cluster")

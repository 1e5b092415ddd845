"""The caller's half of a recorded call (``recording.recorder``), told the same way on
every path of every kind of call the wrappers make; ``UNRECORDED`` when this member does
not record, or the call is not the user's."""

from __future__ import annotations

from .._compat import torch_compat
from ..recording import recorder


class Record:
    """A recorded call's caller half."""

    __slots__ = ("half",)

    def __init__(self, half: list):
        self.half = half

    def trace(self, replies: bool) -> tuple:
        return (recorder.call_id(self.half), replies)

    def sent(self, func, args) -> None:
        recorder.sent(self.half, func, args)

    def failed(self, error: BaseException) -> None:
        recorder.failed(self.half, error)

    def named(self, error: BaseException) -> None:
        recorder.named(self.half, error)

    def answered(self, error: BaseException | None = None) -> None:
        recorder.answered(self.half, error)

    def made_rref(self, rref) -> None:
        half = self.half
        recorder.made_rref(half, rref)
        torch_compat.creation_future(rref).add_done_callback(lambda fut: recorder.answered_future(half, fut))

    def fetching(self, on: bool) -> None:
        recorder.fetching(self.half if on else None)


class Unrecorded:
    """A call that is not recorded: what it would tell its record goes nowhere."""

    __slots__ = ()

    def trace(self, replies: bool) -> None:
        return None

    def sent(self, func, args) -> None: ...

    def failed(self, error: BaseException) -> None: ...

    def named(self, error: BaseException) -> None: ...

    def answered(self, error: BaseException | None = None) -> None: ...

    def made_rref(self, rref) -> None: ...

    def fetching(self, on: bool) -> None: ...


UNRECORDED = Unrecorded()


def record(kind: str, to, func=None, rref=None) -> Record | Unrecorded:
    """The record of a call about to be made: a caller half while this member records
    and the call is the user's (``recorder.outgoing``), else ``UNRECORDED``."""
    if not recorder.RECORDER.recording:
        return UNRECORDED
    half = recorder.outgoing(kind, to, rref=rref, func=func)
    return UNRECORDED if half is None else Record(half)

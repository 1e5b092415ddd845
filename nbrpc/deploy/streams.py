"""A worker kernel's stdout and stderr: what a call writes goes to the driver.

``WorkerStream`` is ipykernel's ``OutStream`` (the kernel app's ``outstream_class``)
that offers each write to ``calls.output`` first: a thread serving a call, or any
thread while no cell runs on this kernel, writes for the driver's running cell;
the rest (a ``%%rpc_on`` cell, and what its threads write meanwhile) the kernel
publishes as before. Warnings and ``logging`` write through the same streams.
"""

from __future__ import annotations

from ipykernel.iostream import OutStream

from ..calls import output

_streams: dict[str, OutStream] = {}


class WorkerStream(OutStream):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _streams[self.name] = self

    def write(self, string: str) -> int | None:
        if isinstance(string, str) and string and output.take(("stream", self.name, string)):
            return len(string)
        return super().write(string)


def publish(pieces: list[tuple]) -> None:
    """Publish pieces the driver could not take through the kernel itself."""
    for piece in pieces:
        stream = _streams.get(piece[1]) if piece[0] == "stream" else None
        if stream is not None:
            OutStream.write(stream, piece[2])


def install(app, name: str) -> None:
    """Route worker ``name``'s output to the driver, once the kernel ``app`` has its
    shell and the worker joined the group."""
    events = app.shell.events
    events.register("pre_execute", lambda: output.set_kernel_busy(True))
    events.register("post_execute", lambda: output.set_kernel_busy(False))
    output.route(name, publish)


OUTSTREAM_CLASS = f"{__name__}.WorkerStream"

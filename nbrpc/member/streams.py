"""A worker kernel's stdout, stderr and displays: what a call writes goes to the driver.

``WorkerStream`` is ipykernel's ``OutStream`` (the kernel app's ``outstream_class``)
that offers each write to ``calls.output`` first: a thread serving a call, or any
thread while no cell runs on this kernel, writes for the driver's running cell;
the rest (a ``%%rpc_on`` cell, and what its threads write meanwhile) the kernel
publishes as before. Warnings and ``logging`` write through the same streams.
The kernel's display publisher does the same with ``display``, ``update_display``
and ``clear_output`` (``install`` puts it in place).
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


def _publisher(shell):
    """The shell's display publisher, offering each display and clear to ``output``."""
    base = type(shell.display_pub)

    class WorkerDisplayPublisher(base):
        def publish(self, data, metadata=None, *, transient=None, update=False, **kwargs):
            if not output.take(("display", data, metadata or {}, transient or {}, update)):
                super().publish(data, metadata, transient=transient, update=update, **kwargs)

        def clear_output(self, wait=False):
            if not output.take(("clear", wait)):
                super().clear_output(wait)

    old = shell.display_pub
    new = WorkerDisplayPublisher(parent=shell, shell=shell)
    new.session, new.pub_socket, new.topic = old.session, old.pub_socket, old.topic
    return new


def install(app, name: str) -> None:
    """Route worker ``name``'s output to the driver, once the kernel ``app`` has its
    shell and the worker joined the group."""
    app.shell.display_pub = _publisher(app.shell)
    events = app.shell.events
    events.register("pre_execute", lambda: output.set_kernel_busy(True))
    events.register("post_execute", lambda: output.set_kernel_busy(False))
    output.UNDELIVERED.add(publish)
    output.route(name)


OUTSTREAM_CLASS = f"{__name__}.WorkerStream"

"""Run code on worker kernels over the Jupyter protocol and stream what they print.

One loop on the calling thread polls every target's IOPub socket, so outputs from
all workers arrive as they happen and are handed to an ``Output`` (the kernel
extension shows them in the cell; the default prints them, tagged by worker).
"""

from __future__ import annotations

import sys
from typing import Protocol

import zmq

from ..errors import RemoteError
from .launchers.base import Worker

POLL_MS = 50


class Output(Protocol):
    """Where outputs from workers go."""

    def stream(self, worker: str, name: str, text: str) -> None: ...

    def display(self, worker: str, data: dict, metadata: dict) -> None: ...


class PrintOutput:
    """Plain-text output for scripts and terminals: every line tagged ``[worker]``."""

    def stream(self, worker, name, text):
        out = sys.stderr if name == "stderr" else sys.stdout
        out.write(text)
        out.flush()

    def display(self, worker, data, metadata):
        print(f"[{worker}] {data.get('text/plain', '')}")


class _LineTagger:
    """Prefix complete lines with the worker's name; hold partial lines back."""

    def __init__(self, worker: str, output: Output):
        self.worker, self.output, self.pending = worker, output, {}

    def feed(self, name: str, text: str) -> None:
        text = self.pending.pop(name, "") + text
        head, sep, tail = text.rpartition("\n")
        if tail:
            self.pending[name] = tail
        if sep:
            tagged = "".join(f"[{self.worker}] {line}\n" for line in head.split("\n"))
            self.output.stream(self.worker, name, tagged)

    def flush(self) -> None:
        for name, text in self.pending.items():
            self.output.stream(self.worker, name, f"[{self.worker}] {text}\n")
        self.pending.clear()


def run(code: str, workers: list[Worker], output: Output, timeout: float | None = None) -> None:
    """Execute ``code`` on every worker at once; raise ``RemoteError`` if any raised.

    A ``KeyboardInterrupt`` while waiting interrupts the workers' kernels too.
    """
    pending = {w.client.execute(code, allow_stdin=False): w for w in workers}
    taggers = {w.name: _LineTagger(w.name, output) for w in workers}
    failures: dict[str, tuple[str, str, list[str]]] = {}
    poller = zmq.Poller()
    for w in workers:
        poller.register(w.client.iopub_channel.socket, zmq.POLLIN)
    try:
        while pending:
            _check_alive(pending, failures)
            if not poller.poll(POLL_MS):
                continue
            for w in workers:
                while w.client.iopub_channel.msg_ready():
                    _handle(w.client.get_iopub_msg(), pending, taggers, failures, output)
    except KeyboardInterrupt:
        for w in pending.values():
            w.interrupt()
        raise
    finally:
        for w in workers:
            poller.unregister(w.client.iopub_channel.socket)
        for tagger in taggers.values():
            tagger.flush()
    if failures:
        raise RemoteError(failures)


def _handle(msg, pending, taggers, failures, output) -> None:
    worker = pending.get(msg["parent_header"].get("msg_id"))
    if worker is None:
        return
    kind, content = msg["msg_type"], msg["content"]
    if kind == "stream":
        taggers[worker.name].feed(content["name"], content["text"])
    elif kind in ("display_data", "execute_result"):
        taggers[worker.name].flush()
        output.display(worker.name, content["data"], content.get("metadata", {}))
    elif kind == "error":
        failures[worker.name] = (content["ename"], content["evalue"], content["traceback"])
    elif kind == "status" and content["execution_state"] == "idle":
        del pending[msg["parent_header"]["msg_id"]]


def _check_alive(pending, failures) -> None:
    for msg_id, worker in list(pending.items()):
        fate = worker.fate()
        if fate:
            failures[worker.name] = ("WorkerDiedError", f"worker {fate} while running the cell", [])
            del pending[msg_id]


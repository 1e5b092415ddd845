"""Run code on worker kernels over the Jupyter protocol and stream what they print.

One loop on the calling thread polls every target's IOPub socket, so outputs from
all workers arrive as they happen and are handed to an ``Output`` (the kernel
extension shows them in the cell; the default prints them, tagged by worker).
``clear_output`` and ``update_display_data`` pass through as nbclient and Jupyter
front ends apply them (a progress display redraws in place).
"""

from __future__ import annotations

from typing import Protocol

import zmq

from ..calls import output as output_mod
from ..calls import prompts
from ..errors import RemoteError
from ..launchers.base import Worker

POLL_MS = 50


class Output(Protocol):
    """Where outputs from workers go."""

    def stream(self, worker: str, name: str, text: str) -> None: ...

    def display(self, worker: str, data: dict, metadata: dict, transient: dict | None = None,
                update: bool = False) -> None: ...

    def clear(self, worker: str, wait: bool) -> None: ...


def run(code: str, workers: list[Worker], output: Output) -> None:
    """Execute ``code`` on every worker at once; raise ``RemoteError`` if any raised.

    A ``KeyboardInterrupt`` while waiting interrupts the workers' kernels too. Where
    the calling cell takes input, so does the code (``input()``, pdb): each worker's
    input request is asked in the calling cell, naming the worker.
    """
    stdin = prompts.takes_input()
    pending = {w.client.execute(code, allow_stdin=stdin): w for w in workers}
    taggers = {w.name: output_mod.LineTagger(w.name, output) for w in workers}
    failures: dict[str, tuple[str, str, list[str]]] = {}
    sockets = [w.client.iopub_channel.socket for w in workers]
    sockets += [w.client.stdin_channel.socket for w in workers] if stdin else []
    poller = zmq.Poller()
    for socket in sockets:
        poller.register(socket, zmq.POLLIN)
    try:
        while pending:
            _check_alive(pending, failures)
            prompts.answer_waiting()  # pdb of a call this cell's code made, prompting here
            if not poller.poll(POLL_MS):
                continue
            for w in workers:
                while w.client.iopub_channel.msg_ready():
                    _handle(w.client.get_iopub_msg(), pending, taggers, failures, output)
                while stdin and w.client.stdin_channel.msg_ready():
                    _answer_input(w, w.client.get_stdin_msg(), taggers[w.name])
    except KeyboardInterrupt:
        for w in pending.values():
            w.interrupt()
        raise
    finally:
        for socket in sockets:
            poller.unregister(socket)
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
    elif kind in ("display_data", "execute_result", "update_display_data"):
        # A display id comes along, so a later update (a progress display) finds it.
        taggers[worker.name].flush()
        output.display(worker.name, content["data"], content.get("metadata", {}),
                       content.get("transient"), kind == "update_display_data")
    elif kind == "clear_output":
        taggers[worker.name].flush()
        output.clear(worker.name, content.get("wait", False))
    elif kind == "error":
        failures[worker.name] = (content["ename"], content["evalue"], content["traceback"])
    elif kind == "status" and content["execution_state"] == "idle":
        del pending[msg["parent_header"]["msg_id"]]


def _answer_input(worker: Worker, msg: dict, tagger: output_mod.LineTagger) -> None:
    """Ask the worker kernel's input request in the calling cell; send back the answer."""
    if msg["msg_type"] != "input_request":
        return
    tagger.flush()  # what the cell printed before it asked
    answer = prompts.read_line(f"[{worker.name}] {msg['content'].get('prompt', '')}")
    worker.client.input("" if answer is None else answer)


def _check_alive(pending, failures) -> None:
    for msg_id, worker in list(pending.items()):
        fate = worker.fate()
        if fate:
            failures[worker.name] = ("WorkerDiedError", f"worker {fate} while running the cell", [])
            del pending[msg_id]


"""The line protocol between the benchmark and a process that measures RPC from inside.

A measuring process (the raw pair's master, the nbrpc driver) prints
``{"ready": true, "pids": [...]}`` once its RPC group is up (``pids``: the processes
it started itself), then answers each JSON command read from stdin
(``{"op": "latency", "count": 200}``) with one JSON line, until ``{"op": "quit"}``
or the end of its input.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

Measure = Callable[[str, int], object]


def claim_stdout() -> TextIO:
    """Keep stdout for replies only; anything else printed (even by C++) goes to stderr."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return replies


def exit_with_parent() -> None:
    """End this process as soon as the benchmark that started it is gone."""
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        # RPC threads would block a normal interpreter exit.
        os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def serve(measure: Measure, replies: TextIO, started_pids: list[int]) -> None:
    """Announce readiness, then answer commands until told to quit."""
    reply(replies, {"ready": True, "pids": started_pids})
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "quit":
            return
        try:
            reply(replies, {"result": measure(command["op"], command["count"])})
        except Exception as e:  # report it; the benchmark decides what to do
            reply(replies, {"error": f"{type(e).__name__}: {e}"})


def reply(replies: TextIO, message: dict) -> None:
    replies.write(json.dumps(message) + "\n")
    replies.flush()

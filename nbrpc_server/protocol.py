"""The side panel's protocol: the names the driver kernel (``nbrpc.kernel_ext.panel``), the
Jupyter server (``nbrpc_server.drivers``) and the TypeScript (``labextension/src/protocol.ts``)
agree on, written once here; a test reads the TypeScript's lists against these.

Parts:

- ``REQUEST``/``REPLY``: the message types on a kernel's control channel; ``QUESTIONS``:
  what a request may ask (``content["what"]``).
- ``BEACON_PREFIX`` and ``beacon_path``: the file a driver writes beside its connection
  file while a cluster runs (``nbrpc-kernel-<id>.json`` beside ``kernel-<id>.json``).
- ``VIEWS``: the views a kernel draws; ``VIEW_OPTIONS``: what a view's request may ask of
  the drawing (the front end's own choices that Python draws, as a widget syncs them);
  ``MEMBER_COLUMNS``: the keys of a member's row.
- ``START_MAGIC`` and ``start_code``: the one line the panel's start form may run.

Plain Python, no imports of nbrpc's runtime: the server imports this without torch.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["BEACON_PREFIX", "MEMBER_COLUMNS", "QUESTIONS", "REPLY", "REQUEST", "START_MAGIC", "VIEWS",
           "VIEW_OPTIONS", "beacon_path", "start_code"]

REQUEST = "nbrpc_panel_request"
REPLY = "nbrpc_panel_reply"
QUESTIONS = ("summary", "view", "shutdown")
BEACON_PREFIX = "nbrpc-"
VIEWS = ("rref", "timeline", "waits", "autograd", "status", "stacks")
VIEW_OPTIONS = ("show_forks",)
MEMBER_COLUMNS = ("name", "rank", "host", "pid", "state", "devices", "busy", "owned_rrefs")
START_MAGIC = "%rpc_init"


def beacon_path(connection_file: str | Path) -> Path:
    """Where the beacon of the kernel with ``connection_file`` lies (it may not exist)."""
    path = Path(connection_file)
    return path.with_name(BEACON_PREFIX + path.name)


def start_code(line: str) -> str:
    """The cell that starts a cluster from the ``%rpc_init`` ``line`` of the panel's form:
    what a user could type. Anything else is refused (the endpoint runs no other code)."""
    line = str(line).strip()
    if "\n" in line or "\r" in line or line.split(" ", 1)[0] != START_MAGIC:
        raise ValueError(f"the start line must be one line beginning with {START_MAGIC}, "
                         f"e.g. '{START_MAGIC} -n 2'; got {line[:80]!r}")
    return f"%load_ext nbrpc\n{line}"

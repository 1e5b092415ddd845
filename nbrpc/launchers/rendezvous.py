"""The driver's join service for workers on other machines, and its client.

Parts:

- Frames: length-prefixed JSON over TCP (``send``, ``receive``).
- ``Rendezvous``: the driver's listener on ``ADDR:PORT``. Every connection opens
  with a hello carrying the cluster's token, compared in constant time; a wrong or
  missing token is refused with a message before anything else happens. A ``join``
  hello is handed to the cluster's ``admit`` (which grants a fresh rank and a
  unique name); a ``store`` hello becomes a relay to the driver's rendezvous store,
  which itself listens on loopback only, so the store is reachable from the
  network only through the token.
- ``Link``: a worker's join connection, kept open as a lifeline. Both ends send a
  heartbeat every second; the worker exits when the driver closes it or goes
  silent, and the driver marks a worker lost when it does the same.
- ``request_join`` and ``relay_store``: the worker's side.
"""

from __future__ import annotations

import hmac
import json
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable

from .._util import LOOPBACK, listening_socket
from ..errors import JoinRefusedError

PROTOCOL = 1
HEARTBEAT = 1.0
# A worker silent this long is reported lost (well inside any sensible RPC timeout).
LOST_AFTER = 5.0
# A worker whose driver is silent this long exits (the driver's host went away).
ORPHANED_AFTER = 8.0
HELLO_TIMEOUT = 10.0
MAX_FRAME = 1 << 20


# -- frames ------------------------------------------------------------------------


def send(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    sock.sendall(struct.pack("!I", len(data)) + data)


def receive(sock: socket.socket) -> dict:
    """The next frame; ``ConnectionError`` if the peer closed or sent garbage."""
    return _decode(_exactly(sock, _size(_exactly(sock, 4))))


def frames(buffer: bytes) -> tuple[list[dict], bytes]:
    """The whole frames at the start of ``buffer`` (bytes read so far), and the rest;
    ``ConnectionError`` for garbage."""
    messages = []
    while len(buffer) >= 4 and len(buffer) >= 4 + _size(buffer[:4]):
        size = _size(buffer[:4])
        messages.append(_decode(buffer[4:4 + size]))
        buffer = buffer[4 + size:]
    return messages, buffer


def _size(header: bytes) -> int:
    (size,) = struct.unpack("!I", header)
    if size > MAX_FRAME:
        raise ConnectionError(f"frame of {size} bytes is larger than {MAX_FRAME}")
    return size


def _decode(data: bytes) -> dict:
    try:
        message = json.loads(data)
    except ValueError as e:
        raise ConnectionError(f"not an nbrpc message: {e}") from e
    if not isinstance(message, dict):
        raise ConnectionError("not an nbrpc message")
    return message


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the connection closed")
        data += chunk
    return data


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host, int(port)


# -- the driver's side -------------------------------------------------------------

Admit = Callable[[socket.socket, tuple, dict], None]


class Rendezvous:
    """Token-checked join service on ``address:port`` (0: a free port).

    ``admit(sock, peer, hello)`` runs on its own thread for each join whose token
    checked; it raises ``JoinRefusedError`` to refuse, or takes the socket over.
    ``on_refused(text)`` hears about every refusal.
    """

    def __init__(self, address: str, port: int, token: str, store_port: int,
                 admit: Admit, on_refused: Callable[[str], None]):
        self._listener = listening_socket(address, port)
        self._listener.settimeout(0.5)
        self.address, self.port = self._listener.getsockname()[:2]
        self._token, self._store_port = token, store_port
        self._admit, self._on_refused = admit, on_refused
        self.refused: list[str] = []
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="nbrpc-rendezvous", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting; connections already admitted carry on."""
        self._closed.set()
        self._thread.join(timeout=5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                sock, peer = self._listener.accept()
            except (TimeoutError, OSError):
                continue
            threading.Thread(target=self._serve, args=(sock, peer), daemon=True,
                             name=f"nbrpc-join-{peer[0]}").start()

    def _serve(self, sock: socket.socket, peer: tuple) -> None:
        sock.settimeout(HELLO_TIMEOUT)
        try:
            hello = receive(sock)
        except (OSError, ConnectionError):
            sock.close()
            return
        try:
            self._check(hello)
            if hello.get("kind") == "store":
                send(sock, {"ok": True})
                _pump(sock, socket.create_connection((LOOPBACK, self._store_port)))
            elif self._closed.is_set():
                raise JoinRefusedError("the cluster is shutting down")
            else:
                self._admit(sock, peer, hello)
        except JoinRefusedError as e:
            self._refuse(sock, peer, hello, str(e))
        except OSError:
            sock.close()

    def _check(self, hello: dict) -> None:
        if hello.get("nbrpc") != PROTOCOL:
            raise JoinRefusedError(
                f"protocol {hello.get('nbrpc')!r} does not match the driver's {PROTOCOL}: "
                "install the same nbrpc version on the worker"
            )
        given = hello.get("token")
        if not isinstance(given, str) or not given:
            raise JoinRefusedError("no token given: pass --token TOKEN (or set NBRPC_TOKEN)")
        if not hmac.compare_digest(given.encode(), self._token.encode()):
            raise JoinRefusedError("wrong token: use the --token printed by the driver for this cluster")

    def _refuse(self, sock: socket.socket, peer: tuple, hello: dict, reason: str) -> None:
        who = f"{peer[0]} (host {hello.get('host', '?')}, pid {hello.get('pid', '?')})"
        self.refused.append(f"{who}: {reason}")
        if hello.get("kind") != "store":
            self._on_refused(f"refused a worker from {who}: {reason}")
        try:
            send(sock, {"ok": False, "error": reason})
        except OSError:
            pass
        finally:
            sock.close()


class Link:
    """A join connection kept open as a lifeline, with heartbeats both ways.

    ``on_message`` gets every frame that is not a heartbeat; ``on_lost(why)`` runs
    once if the peer closes the connection or is silent for ``silent_limit`` s.
    """

    def __init__(self, sock: socket.socket, silent_limit: float,
                 on_message: Callable[[dict], None], on_lost: Callable[[str], None]):
        self.sock, self.silent_limit = sock, silent_limit
        self.on_message, self.on_lost = on_message, on_lost
        self.lost: str | None = None
        self._closed = False
        self._send_lock = threading.Lock()
        sock.settimeout(2.0)  # sends only; reads wait in select
        self._thread = threading.Thread(target=self._run, name="nbrpc-lifeline", daemon=True)
        self._thread.start()

    def send(self, message: dict) -> bool:
        try:
            with self._send_lock:
                send(self.sock, message)
            return True
        except OSError:
            return False

    def close(self) -> None:
        self._closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def wait_closed(self, timeout: float) -> bool:
        """Wait for the peer to close its end (or the link to be lost)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        heard = sent = time.monotonic()
        buffer = b""
        while not self._closed:
            now = time.monotonic()
            if now - sent >= HEARTBEAT:
                self.send({"ping": True})
                sent = now
            try:
                readable = select.select([self.sock], [], [], HEARTBEAT / 4)[0]
                chunk = self.sock.recv(1 << 16) if readable else None
            except (OSError, ValueError):
                chunk = b""
            if chunk == b"":
                return self._lose("closed its connection")
            if chunk is None:
                if time.monotonic() - heard > self.silent_limit:
                    return self._lose(f"sent nothing for {self.silent_limit:g} s (unreachable)")
                continue
            heard = time.monotonic()
            try:
                messages, buffer = frames(buffer + chunk)
            except ConnectionError as e:
                return self._lose(f"sent what is not an nbrpc message ({e})")
            for message in messages:
                if "ping" not in message:
                    self.on_message(message)

    def _lose(self, why: str) -> None:
        if self._closed:
            return
        self.lost = why
        self.on_lost(why)


# -- the worker's side -------------------------------------------------------------


def request_join(address: str, token: str, name: str | None, gpus: int | None = None,
                 timeout: float = 30.0) -> tuple[socket.socket, dict]:
    """Ask the driver at ``address`` to admit this process (``gpus``: how many GPUs torch
    sees here, for the driver's check of its plan); return the socket and grant."""
    host, port = split_address(address)
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        raise ConnectionError(
            f"cannot reach the driver at {address} ({e.strerror or e}): check the address, "
            "that the driver is waiting (%rpc_init --attach), and that no firewall blocks the port"
        ) from e
    send(sock, _hello("join", token, name=name, gpus=gpus))
    try:
        reply = receive(sock)
    except ConnectionError as e:
        sock.close()
        raise ConnectionError(f"the driver at {address} closed the connection: {e}") from e
    if not reply.get("ok"):
        sock.close()
        raise JoinRefusedError(f"the driver at {address} refused this worker: {reply.get('error')}")
    return sock, reply


def relay_store(address: str, token: str) -> int:
    """Serve the driver's rendezvous store on a loopback port of this machine.

    Each connection to the returned port is carried over a new token-checked
    connection to the driver's rendezvous service. The relay runs in a child
    process: torch's store client holds the interpreter lock while it connects,
    so a relay thread in this process could never answer it. The child ends with
    this process (``PR_SET_PDEATHSIG``).
    """
    listener = listening_socket(LOOPBACK, 0)
    port = listener.getsockname()[1]
    parent = os.getpid()
    if os.fork() == 0:
        try:
            _die_with(parent)
            _relay(listener, address, token)
        finally:
            os._exit(0)
    listener.close()
    return port


def _die_with(parent: int) -> None:
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it ended before the line above
        os._exit(0)


def _relay(listener: socket.socket, address: str, token: str) -> None:
    host, port = split_address(address)
    while True:
        local, _ = listener.accept()
        try:
            upstream = socket.create_connection((host, port), timeout=HELLO_TIMEOUT)
            send(upstream, _hello("store", token))
            if not receive(upstream).get("ok"):
                raise ConnectionError("the driver refused the store connection")
        except (OSError, ConnectionError):
            local.close()
            continue
        _pump(local, upstream)


def _hello(kind: str, token: str, **extra) -> dict:
    return {"nbrpc": PROTOCOL, "kind": kind, "token": token,
            "host": socket.gethostname(), "pid": os.getpid(), **extra}


def _pump(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways between two sockets until both directions end."""
    remaining, lock = [2], threading.Lock()
    for sock in (a, b):
        sock.settimeout(None)
        _keepalive(sock)

    def copy(src, dst):
        try:
            while chunk := src.recv(1 << 16):
                dst.sendall(chunk)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
        if last:
            a.close()
            b.close()

    for src, dst in ((a, b), (b, a)):
        threading.Thread(target=copy, args=(src, dst), name="nbrpc-relay", daemon=True).start()


def _keepalive(sock: socket.socket) -> None:
    """Let the system notice a peer that vanished (link cut) within about a minute."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)

"""The rendezvous service and the attach options, on loopback, with real sockets.

The whole path across hosts (real workers in network namespaces) is in
``test_netns.py``; here each refusal and rule is checked on its own, fast.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import threading
import time

import pytest
from conftest import free_port

import nbrpc
from nbrpc import cli
from nbrpc.errors import JoinRefusedError
from nbrpc.launchers import addresses, options, rendezvous
from nbrpc.launchers.rendezvous import Link, Rendezvous, receive, request_join, send

TOKEN = "the-right-token"


@pytest.fixture
def service():
    """A rendezvous on loopback whose store relay leads to a plain echo server."""
    echo = socket.create_server(("127.0.0.1", 0))
    admitted, refused = [], []

    def serve_echo():
        while True:
            try:
                conn, _ = echo.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(1024):
                    conn.sendall(data)

    threading.Thread(target=serve_echo, daemon=True).start()

    def admit(sock, peer, hello):
        if hello.get("name") == "refuse-me":
            raise JoinRefusedError("the name 'refuse-me' is taken")
        admitted.append(hello)
        send(sock, {"ok": True, "name": hello.get("name") or "worker1", "rank": 1, "settings": {}})
        sock.close()

    server = Rendezvous("127.0.0.1", 0, TOKEN, echo.getsockname()[1], admit, refused.append)
    server.admitted, server.refused_messages = admitted, refused
    yield server
    server.close()
    echo.close()


def _address(server) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.mark.parametrize("token, reason", [
    ("wrong", "wrong token: use the --token printed by the driver"),
    ("", "no token given: pass --token TOKEN (or set NBRPC_TOKEN)"),
    (TOKEN[:-1], "wrong token"),
])
def test_bad_token_is_refused_on_both_sides(service, token, reason):
    with pytest.raises(JoinRefusedError, match=re.escape(f"refused this worker: {reason}")):
        request_join(_address(service), token, "w")
    assert service.admitted == []
    assert len(service.refused_messages) == 1
    assert "refused a worker from 127.0.0.1" in service.refused_messages[0]
    assert reason in service.refused_messages[0]


def test_right_token_is_admitted(service):
    sock, grant = request_join(_address(service), TOKEN, "alice")
    sock.close()
    assert grant["name"] == "alice" and grant["rank"] == 1
    assert [h["name"] for h in service.admitted] == ["alice"]
    assert service.refused == []


def test_admission_can_refuse(service):
    with pytest.raises(JoinRefusedError, match="the name 'refuse-me' is taken"):
        request_join(_address(service), TOKEN, "refuse-me")


def _hello(kind: str, token: str, **extra) -> dict:
    return {"nbrpc": rendezvous.PROTOCOL, "kind": kind, "token": token, "host": "h", "pid": 1, **extra}


def test_store_relay_needs_the_token(service):
    with socket.create_connection(("127.0.0.1", service.port)) as sock:
        send(sock, _hello("store", "wrong"))
        assert receive(sock) == {"ok": False, "error": "wrong token: use the --token printed by the "
                                                       "driver for this cluster"}
        assert sock.recv(1) == b""  # closed: nothing reaches the store
    with socket.create_connection(("127.0.0.1", service.port)) as sock:
        send(sock, _hello("store", TOKEN))
        assert receive(sock) == {"ok": True}
        sock.sendall(b"ping through the relay")
        assert sock.recv(100) == b"ping through the relay"


def test_other_protocol_and_garbage_are_refused(service):
    with socket.create_connection(("127.0.0.1", service.port)) as sock:
        send(sock, {**_hello("join", TOKEN), "nbrpc": 99})
        assert "install the same nbrpc version" in receive(sock)["error"]
    for junk in (b"GET / HTTP/1.1\r\n\r\n", struct.pack("!I", 5) + b"{{{{{", struct.pack("!I", 1 << 30)):
        with socket.create_connection(("127.0.0.1", service.port)) as sock:
            sock.sendall(junk)
            sock.settimeout(rendezvous.HELLO_TIMEOUT + 5)
            try:
                answer = sock.recv(100)
            except ConnectionResetError:
                answer = b""
            assert answer == b""  # dropped without an answer
    assert service.admitted == []
    sock, _ = request_join(_address(service), TOKEN, "still-serving")
    sock.close()


def test_link_reports_a_silent_peer_and_a_closed_one():
    a, b = socket.socketpair()
    lost = []
    link = Link(a, silent_limit=1.5, on_message=lambda m: None, on_lost=lost.append)
    began = time.monotonic()
    assert link.wait_closed(5)
    assert lost == ["sent nothing for 1.5 s (unreachable)"]
    assert 1.4 < time.monotonic() - began < 4
    link.close()
    b.close()

    a, b = socket.socketpair()
    heard, lost = [], []
    link = Link(a, silent_limit=30, on_message=heard.append, on_lost=lost.append)
    send(b, {"ping": True})
    send(b, {"exit": 0})
    time.sleep(0.3)
    b.close()
    assert link.wait_closed(5)
    assert heard == [{"exit": 0}] and lost == ["closed its connection"]
    link.close()


def test_join_to_nowhere_says_what_to_check():
    port = free_port()
    with pytest.raises(ConnectionError, match=f"cannot reach the driver at 127.0.0.1:{port}"):
        request_join(f"127.0.0.1:{port}", TOKEN, None, timeout=5)


# -- options ----------------------------------------------------------------------


def test_hosts_are_expanded():
    assert options.parse_hosts("hostA,hostB:2") == ["hostA", "hostB", "hostB"]
    assert options.parse_hosts(["a:1", "b"]) == ["a", "b"]
    for bad in ("", "a:0", ":2"):
        with pytest.raises(ValueError):
            options.parse_hosts(bad)


def test_bind_must_be_one_address_of_this_machine():
    assert addresses.resolve_bind("127.0.0.1") == ("127.0.0.1", "lo")
    assert addresses.resolve_bind("lo") == ("127.0.0.1", "lo")
    with pytest.raises(ValueError, match="would listen on every interface"):
        addresses.resolve_bind("0.0.0.0")
    with pytest.raises(ValueError, match="not an address of this machine"):
        addresses.resolve_bind("192.0.2.77")


@pytest.mark.parametrize("options, message", [
    (dict(n=2, attach=2), "n is for local workers"),
    (dict(attach=2, hosts="a"), "not both"),
    (dict(bind="127.0.0.1"), "bind and port are for workers on other machines"),
    (dict(attach=-1, bind="127.0.0.1"), "attach must be the number of workers"),
    (dict(attach=1, bind="127.0.0.1", port=70000), "port must be a number"),
    (dict(hosts="a:2", names=["x"], bind="127.0.0.1"), "2 SSH workers but 1 names"),
    (dict(attach=1, names=["bad name"], bind="127.0.0.1"), "invalid worker name"),
])
def test_attach_options_are_checked(options, message):
    with pytest.raises(ValueError, match=message):
        nbrpc.Cluster(**options)


def test_attach_cluster_prints_a_command_with_a_fresh_token():
    first = nbrpc.Cluster(attach=1, bind="127.0.0.1", port=29999)
    second = nbrpc.Cluster(attach=1, bind="127.0.0.1", port=29999)
    assert first.join_command.startswith("nbrpc worker --join 127.0.0.1:29999 --token ")
    assert first.join_command != second.join_command
    assert len(first.join_command.rsplit(" ", 1)[1]) >= 32
    assert nbrpc.Cluster(1).join_command is None


def test_the_printed_command_parses_whatever_the_token():
    """The worker's own parser reads back every printed command's address and token
    (a token beginning with "-" once read as an option: 1 cluster in 64)."""
    for _ in range(300):
        command = nbrpc.Cluster(attach=1, bind="127.0.0.1", port=29999).join_command
        program, *argv = command.split()
        args = cli.parser().parse_args(argv)
        assert (program, args.join, args.token) == ("nbrpc", "127.0.0.1:29999", command.rsplit(" ", 1)[1])


def test_frames_come_whole_across_reads_and_garbage_is_refused():
    first, second = (json.dumps(m).encode() for m in ({"a": 1}, {"b": 2}))
    data = b"".join(struct.pack("!I", len(body)) + body for body in (first, second))
    messages, rest = rendezvous.frames(data[:-3])  # the second frame not whole yet
    assert messages == [{"a": 1}] and rest == data[4 + len(first):-3]
    assert rendezvous.frames(rest + data[-3:]) == ([{"b": 2}], b"")
    with pytest.raises(ConnectionError, match="larger than"):
        rendezvous.frames(struct.pack("!I", rendezvous.MAX_FRAME + 1))
    with pytest.raises(ConnectionError, match="not an nbrpc message"):
        rendezvous.frames(struct.pack("!I", 3) + b"[1]")


def test_a_misspelt_launcher_option_is_named():
    with pytest.raises(TypeError, match=r"unexpected options 'atach'.*attach=N"):
        nbrpc.Cluster(atach=2)
    assert type(nbrpc.Cluster(attach=2, port=0).launcher).__name__ == "AttachLauncher"

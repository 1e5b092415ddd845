"""The side panel's server endpoints (``nbrpc_server``) in a real Jupyter server, whose
real kernels run real clusters started through the endpoint: what they list, while a cell
is stuck too, shutting down a stuck cell's cluster, and who may ask (a deployment's
authorizer that denies kernels included). Loading the extension imports no torch.

The server runs on 127.0.0.1 with token auth in its own runtime directory; its kernels
are started through its REST API and driven with a jupyter-client over their connection
files, as a notebook would drive them. A kernel this server does not own (started by the
test itself, running a cluster too) is never listed nor answered for. Every process
ends by pid.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

import pytest
from conftest import LOCK_CELL, execute, free_port, wait_gone, wait_until

from nbrpc._util import kill_pids, pid_alive

pytestmark = pytest.mark.slow

# Seconds a start may take on a loaded machine (the %rpc_init cell's own wait).
START = 240
SETUP = "import threading\nimport torch.distributed.rpc as rpc"
# A deployment's authorizer that lets a user log in but not use kernels (jupyter_server's "kernels" resource).
DENY_KERNELS = """
from jupyter_server.auth import Authorizer

class DenyKernels(Authorizer):
    def is_authorized(self, handler, user, action, resource):
        return resource != "kernels"
"""


def descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


class JupyterServer:
    """A jupyter_server of this test: URL, token, runtime folder, process."""

    def __init__(self, root: Path, base_url: str = "/", args=(), env=None):
        self.root, self.port, self.token = root, free_port(), secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}{base_url.rstrip('/')}"
        self.runtime = root / "runtime"
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(self.runtime),
               "JUPYTER_CONFIG_DIR": str(root / "config"), **(env or {})}
        self.log = open(root / "server.log", "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
             f"--ServerApp.base_url={base_url}", "--ServerApp.terminals_enabled=False", *args,
             *(["--allow-root"] if os.geteuid() == 0 else [])],
            cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(lambda: self._up(), timeout=90, interval=0.3)

    def _up(self) -> bool:
        assert self.process.poll() is None, (self.root / "server.log").read_text()[-3000:]
        try:
            self.api("/api/status")
            return True
        except OSError:
            return False

    def request(self, path: str, method: str = "GET", token: bool = True, headers=None, opener=None, body=None,
                timeout: float = 30):
        """(status, JSON body) of a request, with the token unless told not to."""
        headers = {**({"Authorization": f"token {self.token}"} if token else {}), **(headers or {})}
        data = (json.dumps(body).encode() if body is not None else b"") if method == "POST" else None
        request = urllib.request.Request(f"{self.url}{path}", method=method, headers=headers, data=data)
        try:
            with (opener or urllib.request.build_opener()).open(request, timeout=timeout) as response:
                body = response.read()
                return response.status, (json.loads(body) if body else None)
        except urllib.error.HTTPError as e:
            e.close()
            return e.code, None

    def api(self, path: str, method: str = "GET", body=None, timeout: float = 30):
        status, answer = self.request(path, method, body=body, timeout=timeout)
        if status >= 400:
            raise OSError(f"{method} {path}: {status}")
        return answer

    def client(self, kernel_id: str):
        from jupyter_client import BlockingKernelClient

        kc = BlockingKernelClient(connection_file=str(self.runtime / f"kernel-{kernel_id}.json"))
        kc.load_connection_file()
        kc.start_channels(hb=False)  # the heartbeat may lag on a loaded machine; the server watches it
        kc.wait_for_ready(timeout=120)
        return kc

    def stop(self) -> None:
        pids = descendants(self.process.pid)
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        kill_pids([p for p in pids if pid_alive(p)])
        self.log.close()
        assert not wait_gone(pids), "processes of the Jupyter server survived"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = JupyterServer(tmp_path_factory.mktemp("server"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def driver(server):
    """A kernel of the server running a one-worker cluster started as the panel's form does
    (the start endpoint): (kernel id, client)."""
    kernel_id = server.api("/api/kernels", "POST")["id"]
    kc = server.client(kernel_id)
    try:
        started = server.api(f"/nbrpc/clusters/{kernel_id}/start", "POST", {"line": "%rpc_init -n 1"}, START)
        assert started == {"ran": "%load_ext nbrpc\n%rpc_init -n 1", "status": "ok"}, started
        _, reply = execute(kc, SETUP, timeout=180)
        assert reply["status"] == "ok", reply
        yield kernel_id, kc
    finally:
        kc.stop_channels()
        server.api(f"/api/kernels/{kernel_id}", "DELETE")


def clusters(server) -> list[dict]:
    return server.api("/nbrpc/clusters")["clusters"]


def test_a_running_cluster_is_listed_with_its_members(server, driver):
    kernel_id, _ = driver
    (entry,) = wait_until(lambda: clusters(server), timeout=5)
    assert entry["kernel_id"] == kernel_id
    members = entry["cluster"]["members"]
    assert [m["name"] for m in members] == ["master", "worker1"]
    assert all(m["pid"] and m["host"] and m["state"] for m in members)
    assert entry["cluster"]["findings"] == []


def test_views_are_drawn_by_the_kernel(server, driver):
    kernel_id, _ = driver
    for view, trait, mark in [("rref", "svg", 'data-kind="rref"'), ("waits", "svg", 'data-kind="waits"'),
                              ("status", "html", "nbrpc-status")]:
        answer = server.api(f"/nbrpc/clusters/{kernel_id}/views/{view}")
        assert mark in answer["state"][trait], (view, answer)
        assert answer["state"]["status"] == answer["summary"] and "front_end" not in answer
    assert "master" in server.api(f"/nbrpc/clusters/{kernel_id}/views/stacks")["html"]
    answer = server.api(f"/nbrpc/clusters/{kernel_id}/views/timeline")
    assert "--trace" in answer["summary"] and "state" not in answer


def test_a_view_is_its_widgets_own_front_end_and_state(server, driver):
    """What a docked view shows: the widget's ES module and CSS as anywidget sends them, and
    the state its traits would hold; the fork history, a choice Python draws, passed on."""
    from nbrpc.widgets.base import GraphWidget
    from nbrpc.widgets.status import ClusterStatus

    kernel_id, kc = driver
    _, reply = execute(kc, "import torch\nr = rpc.remote('worker1', torch.ones, args=((2, 3),))\nr.to_here()",
                       timeout=60)
    assert reply["status"] == "ok", reply
    answer = server.api(f"/nbrpc/clusters/{kernel_id}/views/rref?front_end=1")
    assert answer["front_end"] == {"esm": GraphWidget._esm, "css": GraphWidget._css}
    state = answer["state"]
    assert state["kind"] == "rref" and state["status"] == answer["summary"], state
    (rref_id,) = state["details"]
    rows = dict(state["details"][rref_id]["rows"])
    assert rows["owner"] == "worker1" and rows["holders"] == "master"
    assert f'data-id="{rref_id}"' in state["svg"] and "nbrpc-forks" not in state["svg"]
    forks = server.api(f"/nbrpc/clusters/{kernel_id}/views/rref?show_forks=1")["state"]["svg"]
    assert "nbrpc-forks" in forks
    status = server.api(f"/nbrpc/clusters/{kernel_id}/views/status?front_end=1")
    assert status["front_end"] == {"esm": str(ClusterStatus._esm), "css": str(ClusterStatus._css)}
    assert "worker1" in status["state"]["html"]
    assert "front_end" not in server.api(f"/nbrpc/clusters/{kernel_id}/views/stacks?front_end=1")
    execute(kc, "del r", timeout=60)


def test_no_token_is_refused_and_a_post_needs_xsrf(server, driver):
    kernel_id, _ = driver
    assert server.request("/nbrpc/clusters", token=False)[0] == 403
    assert server.request(f"/nbrpc/clusters/{kernel_id}/interrupt", "POST", token=False)[0] == 403
    # Logged in by cookie (as a browser is), a POST without the XSRF token is refused.
    jar = CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with browser.open(f"{server.url}/login?token={server.token}", timeout=30) as page:
        page.read()
    assert server.request("/nbrpc/clusters", token=False, opener=browser)[0] == 200
    assert server.request(f"/nbrpc/clusters/{kernel_id}/interrupt", "POST", token=False, opener=browser)[0] == 403
    xsrf = next(c.value for c in jar if c.name == "_xsrf")
    status, _ = server.request(f"/nbrpc/clusters/{kernel_id}/interrupt", "POST", token=False, opener=browser,
                               headers={"X-XSRFToken": xsrf})
    assert status == 200


def test_a_kernel_this_server_does_not_own_is_not_listed(server, driver, kernel):
    km, kc = kernel
    _, reply = execute(kc, "%load_ext nbrpc\n%rpc_init -n 1", timeout=180)
    assert reply["status"] == "ok", reply
    assert Path(km.connection_file).with_name("nbrpc-" + Path(km.connection_file).name).exists()
    foreign = Path(km.connection_file).stem.removeprefix("kernel-")
    assert [c["kernel_id"] for c in clusters(server)] == [driver[0]]
    assert server.request(f"/nbrpc/clusters/{foreign}/views/status")[0] == 404
    assert server.request(f"/nbrpc/clusters/{foreign}/interrupt", "POST")[0] == 404
    execute(kc, "%rpc_shutdown", timeout=60)


def test_a_stuck_cell_turns_its_cluster_red_while_the_kernel_is_busy(server, driver):
    kernel_id, kc = driver
    began = time.monotonic()
    msg_id = kc.execute(LOCK_CELL)

    def stuck():
        (entry,) = clusters(server)
        return entry["cluster"]["findings"]

    findings = wait_until(stuck, timeout=10, interval=0.2)
    took = time.monotonic() - began
    assert findings[0]["kind"] == "blocked" and "worker1" in findings[0]["message"]
    assert took < 3.0, f"the finding came {took:.1f} s after the cell began"
    # While stuck: the wait-for graph and the stacks.
    waits = server.api(f"/nbrpc/clusters/{kernel_id}/views/waits")
    assert "nbrpc-alarm" in waits["state"]["svg"]
    assert "outer" in server.api(f"/nbrpc/clusters/{kernel_id}/views/stacks")["html"]
    # Views asked over RPC keep their last drawing meanwhile: no RPC queues behind the stuck ones.
    paused = server.api(f"/nbrpc/clusters/{kernel_id}/views/rref")
    assert "state" not in paused and "began to wait" in paused["summary"]
    # The stop button: an interrupt ends the stuck call.
    server.api(f"/nbrpc/clusters/{kernel_id}/interrupt", "POST")
    reply = kc.get_shell_msg(timeout=60)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=60)
    assert reply["content"]["status"] == "error"


def test_shutdown_from_the_panel_ends_a_stuck_cell(server, driver):
    """The shut-down endpoint is %rpc_shutdown on the control channel: it works while a cell
    is stuck, and the stuck call fails as its worker ends."""
    kernel_id, kc = driver
    wait_until(lambda: not clusters(server)[0]["cluster"]["waiting"], timeout=30, interval=0.3)
    running = server.api(f"/nbrpc/clusters/{kernel_id}/start", "POST", {"line": "%rpc_init -n 1"}, START)
    assert running["status"] == "error" and "ClusterRunningError" in running["error"], running
    msg_id = kc.execute(LOCK_CELL)
    wait_until(lambda: clusters(server)[0]["cluster"]["findings"], timeout=10, interval=0.2)
    answer = server.api(f"/nbrpc/clusters/{kernel_id}/shutdown", "POST")
    assert answer["shut_down"] is True and "shut down" in answer["summary"], answer
    reply = kc.get_shell_msg(timeout=60)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=60)
    assert reply["content"]["status"] == "error"
    assert wait_until(lambda: clusters(server) == [], timeout=3)
    assert server.request(f"/nbrpc/clusters/{kernel_id}/shutdown", "POST")[0] == 404
    # Start again for the next test; anything but a %rpc_init line is refused.
    assert server.request(f"/nbrpc/clusters/{kernel_id}/start", "POST", body={"line": "import os"})[0] == 400
    assert server.request(f"/nbrpc/clusters/{kernel_id}/start", "POST",
                          body={"line": "%rpc_init -n 1\nimport os"})[0] == 400
    again = server.api(f"/nbrpc/clusters/{kernel_id}/start", "POST", {"line": "%rpc_init -n 1"}, START)
    assert again["status"] == "ok", again


def test_shutdown_removes_the_cluster(server, driver):
    kernel_id, kc = driver
    wait_until(lambda: clusters(server) and not clusters(server)[0]["cluster"]["waiting"], timeout=30, interval=0.3)
    _, reply = execute(kc, "%rpc_shutdown", timeout=120)
    assert reply["status"] == "ok", reply
    assert wait_until(lambda: clusters(server) == [], timeout=3)
    assert server.api(f"/nbrpc/clusters/{kernel_id}/views/rref")["ended"] is True


def test_an_authorizer_that_denies_kernels_is_obeyed(tmp_path):
    """A deployment's Authorizer that denies a user the kernels denies them nbrpc's endpoints."""
    (tmp_path / "deny_kernels.py").write_text(DENY_KERNELS)
    server = JupyterServer(tmp_path, args=["--ServerApp.authorizer_class=deny_kernels.DenyKernels"],
                           env={"PYTHONPATH": str(tmp_path)})
    try:
        assert server.request("/api/kernels")[0] == 403
        kernel_id = "0" * 8
        assert server.request("/nbrpc/clusters")[0] == 403
        assert server.request(f"/nbrpc/clusters/{kernel_id}/views/status")[0] == 403
        for action in ("start", "shutdown", "interrupt"):
            assert server.request(f"/nbrpc/clusters/{kernel_id}/{action}", "POST",
                                  body={"line": "%rpc_init"})[0] == 403, action
    finally:
        server.stop()


LOAD_EXTENSION = """
import json, sys
from jupyter_server.serverapp import ServerApp

app = ServerApp()
app.initialize(argv=["--ServerApp.port={port}", "--ServerApp.port_retries=0", "--ServerApp.ip=127.0.0.1",
                     "--ServerApp.open_browser=False"])
print(json.dumps({{"loaded": "nbrpc_server" in app.extension_manager.extension_apps,
                  "heavy": sorted(m for m in ("torch", "nbrpc") if m in sys.modules)}}))
"""


def test_loading_the_server_extension_imports_no_torch(tmp_path):
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_CONFIG_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", LOAD_EXTENSION.format(port=free_port())], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"loaded": True, "heavy": []}


def test_endpoints_live_under_the_base_url(tmp_path):
    """As under JupyterHub, whose single-user servers run under /user/<name>/."""
    server = JupyterServer(tmp_path, base_url="/user/alice/")
    try:
        assert server.api("/nbrpc/clusters") == {"clusters": []}
        outside = urllib.request.Request(f"http://127.0.0.1:{server.port}/nbrpc/clusters",
                                         headers={"Authorization": f"token {server.token}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(outside, timeout=30)
        refused.value.close()
        assert refused.value.code == 404
    finally:
        server.stop()
    # The extension closes its channels when the server stops.
    assert "nbrpc_server: closed the side panel's channels" in (tmp_path / "server.log").read_text()

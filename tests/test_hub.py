"""nbrpc behind a real JupyterHub: real users, each student's server spawned as that user.

The hub (``jupyterhub`` with ``configurable-http-proxy``, the local process spawner and
the dummy authenticator) runs as root, as a department server's does; the students are
Unix users made by the test. Each student's server starts through the hub's API; each
student opens an nbrpc kernel through the hub's proxy and runs ``%rpc_init -n 2`` over
the kernel's websocket, as the notebook page does. Checked: every student's kernel and
workers run as that student, one student's token opens nothing of another's server,
and stopping a server from the hub ends its kernel and workers.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import nbformat
import psutil
import pytest
from conftest import free_port, wait_gone, wait_until
from test_browser import ARTIFACTS, chromium_tab, why_no_browser
from users import ROOT, SYSTEM_PYTHON, unavailable

pytestmark = [pytest.mark.hub, pytest.mark.slow]  # each test starts a hub and real users' servers

STUDENTS = ("nbrpc-hub-a", "nbrpc-hub-b", "nbrpc-hub-c")
HUB_START = 120.0
SERVER_START = 180.0

CONFIG = """
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.JupyterHub.db_url = "sqlite:///{folder}/hub.sqlite"
c.JupyterHub.cookie_secret_file = "{folder}/cookie_secret"
c.JupyterHub.pid_file = "{folder}/hub.pid"
c.ConfigurableHTTPProxy.pid_file = "{folder}/proxy.pid"
c.JupyterHub.cleanup_servers = False  # a restarted hub finds the students' servers running
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {password!r}
c.Authenticator.allowed_users = set({students!r})
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [{python!r}, "-m", "jupyterhub.singleuser"]
c.Spawner.start_timeout = {server_start}
c.Spawner.http_timeout = {server_start}
c.Spawner.environment = {environment!r}
c.JupyterHub.services = [{{"name": "tests", "api_token": {token!r}}}]
c.JupyterHub.load_roles = [{{"name": "tests", "services": ["tests"],
                            "scopes": ["admin:users", "admin:servers", "tokens", "access:servers"]}}]
"""


class Hub:
    def __init__(self, folder, pids, students=STUDENTS, environment=None, extra_config: str = ""):
        """A hub for ``students``; ``environment`` joins every server's, ``extra_config``'s lines
        follow (and win over) the base configuration."""
        self.folder = folder
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.kernels = folder / "share" / "jupyter" / "kernels" / "nbrpc"
        self.kernels.mkdir(parents=True)
        spec = {"argv": [SYSTEM_PYTHON, str(ROOT / "nbrpc" / "shared_server" / "kernel.py"), "-f", "{connection_file}"],
                "display_name": "Python 3 (nbrpc)", "language": "python"}
        (self.kernels / "kernel.json").write_text(json.dumps(spec))
        # JupyterLab for the students' servers, from this environment's files: its
        # application, the widgets' front ends and nbrpc's side panel, and the server
        # extensions turned on (JupyterLab's, and nbrpc's as installing nbrpc enables it).
        ours = Path(sys.prefix) / "share" / "jupyter"
        (folder / "share" / "jupyter" / "labextensions").symlink_to(ours / "labextensions")
        (folder / "etc").mkdir()
        (folder / "etc" / "jupyter_server_config.json").write_text(
            json.dumps({"ServerApp": {"jpserver_extensions": {"jupyterlab": True, "nbrpc_server": True}},
                        "LabApp": {"expose_app_in_browser": True}}))  # the tests drive the page
        for part in (folder, folder / "share", folder / "share" / "jupyter", folder / "share" / "jupyter" / "kernels",
                     self.kernels, folder / "etc"):
            os.chmod(part, 0o755)
        environment = {"PYTHONPATH": os.pathsep.join([str(ROOT), _site_packages()]),
                       "JUPYTER_PATH": str(folder / "share" / "jupyter"), "NBRPC_MAX_WORKERS": "4",
                       "JUPYTERLAB_DIR": str(ours / "lab"), "JUPYTER_CONFIG_PATH": str(folder / "etc"),
                       "NBRPC_TEST_RUN": os.environ.get("NBRPC_TEST_RUN", ""), "PATH": "/usr/bin:/bin",
                       **(environment or {})}
        config = folder / "jupyterhub_config.py"
        config.write_text(CONFIG.format(
            port=self.port, hub_port=free_port(), proxy_api_port=free_port(), folder=folder,
            password="class", students=list(students), python=SYSTEM_PYTHON, server_start=int(SERVER_START),
            environment=environment, token=self.token) + extra_config)
        self.config, self.pids = config, pids
        self.log = open(folder / "hub.log", "ab")
        self._start()

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(self.config)], cwd=self.folder,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.pids.add(self.proc.pid)
        wait_until(lambda: self._answers(), timeout=HUB_START, interval=0.5) or pytest.fail(
            f"the hub did not answer within {HUB_START:g} s:\n{self.tail()}")

    def restart(self) -> None:
        """Stop the hub (and the proxy it started), then start it again."""
        self._stop()
        self._start()

    def tail(self) -> str:
        return (self.folder / "hub.log").read_text(errors="replace")[-4000:]

    def _answers(self) -> bool:
        try:
            return self.api("GET", "/hub/api/")[0] == 200
        except OSError:
            return False

    def api(self, method: str, path: str, body=None, token: str | None = None):
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"token {token or self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as reply:
                text = reply.read().decode()
                return reply.status, json.loads(text) if text else None
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode(errors="replace")

    def start_server(self, name: str) -> str:
        """Start ``name``'s server; return a token of that user's."""
        status, _ = self.api("POST", f"/hub/api/users/{name}/server")
        assert status in (201, 202), f"spawn of {name}: {status}\n{self.tail()}"
        ready = wait_until(lambda: self.api("GET", f"/hub/api/users/{name}")[1]["servers"].get("", {})
                           .get("ready"), timeout=SERVER_START, interval=1.0)
        assert ready, f"{name}'s server did not start:\n{self.tail()}"
        status, made = self.api("POST", f"/hub/api/users/{name}/tokens", {"note": "tests"})
        assert status == 201, made
        return made["token"]

    def server_pid(self, name: str) -> int:
        return [p.pid for p in psutil.process_iter(["cmdline", "username"])
                if p.info["username"] == name and "jupyterhub.singleuser" in " ".join(p.info["cmdline"] or ())][0]

    def close(self) -> None:
        self._stop()
        self.log.close()

    def _stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _site_packages() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


def hub_unavailable() -> str | None:
    """Why a hub with real users cannot run here, or None."""
    why = unavailable()
    if why is None and not shutil.which("configurable-http-proxy"):
        why = "needs configurable-http-proxy (npm), which .ci/system-packages.sh installs"
    return why


def make_students(names) -> None:
    """Unix users ``names`` (made once per machine), each with a fresh home of their own."""
    for name in names:
        home = f"/tmp/hub-home-{name}"
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--system", "--home-dir", home, "--shell", "/usr/sbin/nologin", name],
                           check=True)
        entry = pwd.getpwnam(name)
        shutil.rmtree(entry.pw_dir, ignore_errors=True)
        os.makedirs(entry.pw_dir, mode=0o700)
        os.chown(entry.pw_dir, entry.pw_uid, entry.pw_gid)


def remove_homes(names) -> None:
    for name in names:
        shutil.rmtree(pwd.getpwnam(name).pw_dir, ignore_errors=True)


@pytest.fixture
def hub(pids):
    yield from _running_hub(pids)


@pytest.fixture
def culling_hub(pids):
    """A hub with a service for jupyterhub-idle-culler, which ``start_culler`` starts."""
    yield from _running_hub(pids, students=STUDENTS[:1], extra_config=CULLER.format(token=CULLER_TOKEN))


def _running_hub(pids, students=STUDENTS, **options):
    why = hub_unavailable()
    if why:
        pytest.skip(why)
    make_students(students)
    # Outside pytest's folders, which only we can enter: the students' servers read the kernel spec.
    folder = Path(tempfile.mkdtemp(prefix="hub-"))
    try:
        running = Hub(folder, pids, students=students, **options)
        yield running
        running.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        # What the students still run (servers the test left running, a kernel started as its
        # server ended) is ended by pid after the test, not left to the next test of theirs.
        pids.add(*[pid for pid, _ in students_processes(students)])
        remove_homes(students)


def students_processes(names) -> list[tuple[int, str]]:
    """The students' live processes (zombies have ended: only their parent's reaping is left)."""
    return [(q.pid, " ".join(q.info["cmdline"] or ()))
            for q in psutil.process_iter(["username", "cmdline", "status"])
            if q.info["username"] in names and q.info["status"] != psutil.STATUS_ZOMBIE]


# The idle culler as an external service of the hub, started by the test once its cluster is
# up: started with the hub, it counted the server idle from its start and once culled it as
# its first kernel started, on a slow machine.
CULLER_TOKEN = secrets.token_hex(16)
CULLER = """
c.JupyterHub.services.append({{"name": "idle-culler", "api_token": {token!r}}})
c.JupyterHub.load_roles.append({{"name": "idle-culler", "services": ["idle-culler"],
    "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]}})
c.JupyterHub.last_activity_interval = 2  # the proxy's activity, read often
"""


def start_culler(hub: Hub) -> subprocess.Popen:
    """jupyterhub-idle-culler, stopping the hub's servers idle for 10 s."""
    culler = subprocess.Popen([sys.executable, "-m", "jupyterhub_idle_culler", "--timeout=10", "--cull-every=2"],
                              stdout=hub.log, stderr=subprocess.STDOUT,
                              env={**os.environ, "JUPYTERHUB_API_TOKEN": CULLER_TOKEN,
                                   "JUPYTERHUB_API_URL": f"http://127.0.0.1:{hub.port}/hub/api"})
    hub.pids.add(culler.pid)
    return culler


async def run_cells(url: str, token: str, cells: list[str], timeout: float = 300) -> list[dict]:
    """Execute ``cells`` over a kernel's websocket; each cell's stdout and reply status."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    socket = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}))
    results = []
    try:
        for code in cells:
            msg_id = uuid.uuid4().hex
            await socket.write_message(json.dumps({
                "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "", "session": "tests",
                           "version": "5.3"},
                "parent_header": {}, "metadata": {}, "channel": "shell",
                "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                            "allow_stdin": False, "stop_on_error": True}}))
            out, status, idle = [], None, False
            deadline = time.monotonic() + timeout
            while status is None or not idle:  # the reply (shell) and idle (IOPub) come in either order
                raw = await asyncio.wait_for(socket.read_message(), deadline - time.monotonic())
                assert raw is not None, "the kernel's websocket closed"
                message = json.loads(raw)
                if message["parent_header"].get("msg_id") != msg_id:
                    continue
                if message["msg_type"] == "stream":
                    out.append(message["content"]["text"])
                elif message["msg_type"] == "error":
                    out.append(f"{message['content']['ename']}: {message['content']['evalue']}")
                elif message["msg_type"] == "execute_reply":
                    status = message["content"]["status"]
                elif message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
                    idle = True
            results.append({"out": "".join(out), "status": status})
    finally:
        socket.close()
        try:  # the closing handshake, so that its socket is closed before the loop ends
            while await asyncio.wait_for(socket.read_message(), 10) is not None:
                pass
        except (asyncio.TimeoutError, OSError):
            pass
    return results


CELLS = [
    "%load_ext nbrpc",
    "%rpc_init -n 2",
    "import json, os, nbrpc\nimport torch.distributed.rpc as rpc\n"
    "print(json.dumps({'uid': os.getuid(), 'kernel': os.getpid(), "
    "'workers': [w.pid for w in nbrpc.current().workers], "
    "'worker_uids': [rpc.rpc_sync(n, os.getuid) for n in ('worker1', 'worker2')]}))",
]


def test_three_students_each_run_a_cluster_through_the_hub_as_themselves(hub, pids):
    tokens = {name: hub.start_server(name) for name in STUDENTS}
    seen, urls = {}, {}
    for name in STUDENTS:
        pids.add_tree(hub.server_pid(name))
        status, made = hub.api("POST", f"/user/{name}/api/kernels", {"name": "nbrpc"}, token=tokens[name])
        assert status == 201, made
        url = urls[name] = f"ws://127.0.0.1:{hub.port}/user/{name}/api/kernels/{made['id']}/channels"
        results = asyncio.run(run_cells(url, tokens[name], CELLS))
        assert [r["status"] for r in results] == ["ok", "ok", "ok"], results
        assert "master + worker1, worker2 up in" in results[1]["out"]
        seen[name] = json.loads(results[2]["out"].strip().splitlines()[-1])
        pids.add(seen[name]["kernel"], *seen[name]["workers"])
    for name, got in seen.items():
        uid = pwd.getpwnam(name).pw_uid
        assert got["uid"] == uid and got["worker_uids"] == [uid, uid]
        assert {psutil.Process(p).uids().real for p in [got["kernel"], *got["workers"]]} == {uid}

        # The cluster's RPC is in a private network, the kernel on the server's.
        networks = {p: os.readlink(f"/proc/{p}/ns/net") for p in [got["kernel"], *got["workers"]]}
        assert networks[got["kernel"]] == os.readlink("/proc/self/ns/net")
        assert len({networks[p] for p in got["workers"]} - {networks[got["kernel"]]}) == 1

    # One student's token opens nothing of another's server.
    a, b = STUDENTS[:2]
    status, _ = hub.api("GET", f"/user/{a}/api/kernels", token=tokens[b])
    assert status == 403

    # Stopping a server from the hub ends its kernel and its workers within 10 s.
    status, _ = hub.api("DELETE", f"/hub/api/users/{a}/server")
    assert status in (202, 204)
    stopped = time.monotonic()
    assert not wait_gone([seen[a]["kernel"], *seen[a]["workers"]], timeout=10)
    assert time.monotonic() - stopped < 10
    # The others' clusters go on, and the hub is not in their path: restarted, it finds their
    # servers, and their clusters answer through its new proxy.
    for name in STUDENTS[1:]:
        assert all(psutil.pid_exists(p) for p in seen[name]["workers"])
    hub.restart()
    for name in STUDENTS[1:]:
        assert all(psutil.pid_exists(p) for p in [seen[name]["kernel"], *seen[name]["workers"]])
        call = "print(sum(rpc.rpc_sync(n, pow, args=(2, 3)) for n in ('worker1', 'worker2')))"
        answered = wait_until(functools.partial(_answer, urls[name], tokens[name], call), timeout=60, interval=1.0)
        assert answered == [{"out": "16\n", "status": "ok"}]

    # A notebook that never loads nbrpc is untouched by it: a plain kernel imports none of it.
    name = STUDENTS[2]
    status, made = hub.api("POST", f"/user/{name}/api/kernels", {"name": "python3"}, token=tokens[name])
    assert status == 201, made
    plain = f"ws://127.0.0.1:{hub.port}/user/{name}/api/kernels/{made['id']}/channels"
    looked = asyncio.run(run_cells(plain, tokens[name], [
        "import sys\nprint(sorted(m for m in ('nbrpc', 'torch') if m in sys.modules))"]))
    assert looked == [{"out": "[]\n", "status": "ok"}]


def _answer(url: str, token: str, code: str):
    """The cell's result once the proxy routes to the server again; None until then."""
    from tornado.httpclient import HTTPClientError

    try:
        return asyncio.run(run_cells(url, token, [code], timeout=60))
    except (HTTPClientError, OSError):  # the route is not back yet (404, refused)
        return None


GRAPH_CELLS = [
    "%load_ext nbrpc",
    "%rpc_init -n 2",
    "import torch\nimport torch.distributed.rpc as rpc\n"
    "ra = rpc.remote('worker1', torch.ones, args=((2, 3),))\n"
    "rb = rpc.remote('worker2', torch.zeros, args=((4,),))",
    "%rref_graph --interval 0.5",
]


def test_a_students_rref_graph_renders_through_the_hubs_proxy(hub, pids, tmp_path):
    reason = why_no_browser("lab")
    if reason:
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    name = STUDENTS[0]
    hub.start_server(name)
    pids.add_tree(hub.server_pid(name))
    entry = pwd.getpwnam(name)
    notebook = Path(entry.pw_dir) / "graph.ipynb"
    nbformat.write(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(c) for c in GRAPH_CELLS],
        metadata={"kernelspec": {"name": "nbrpc", "display_name": "Python 3 (nbrpc)", "language": "python"}}),
        notebook)
    os.chown(notebook, entry.pw_uid, entry.pw_gid)

    with sync_playwright() as p:
        tab = chromium_tab(p, tmp_path / "profile", 180_000)
        try:
            # As a student does: the hub's login page, then the notebook, all through the proxy.
            tab.goto(f"http://127.0.0.1:{hub.port}/hub/login?next=/user/{name}/lab/tree/graph.ipynb")
            tab.fill("#username_input", name)
            tab.fill("#password_input", "class")
            tab.click("#login_submit")
            tab.wait_for_function(
                "() => window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel"
                "?.connectionStatus === 'connected'")
            assert tab.url.startswith(f"http://127.0.0.1:{hub.port}/user/{name}/lab")
            tab.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            tab.wait_for_selector(".nbrpc-graph .nbrpc-host [data-id]")
            wait_until(lambda: tab.locator(".nbrpc-host [data-id]").count() == 2, timeout=30)
            assert tab.locator(".nbrpc-host [data-id]").count() == 2  # ra and rb
            assert tab.locator(".nbrpc-host [data-lane]").count() == 3  # master, worker1, worker2
            lanes = tab.locator(".nbrpc-host [data-lane]").evaluate_all("ls => ls.map(l => l.dataset.lane)")
            assert sorted(lanes) == ["master", "worker1", "worker2"]
            assert "live, every 0.5 s" in tab.locator(".nbrpc-status").inner_text()
            tab.screenshot(path=str(ARTIFACTS / "hub-rref-graph.png"))
        finally:
            tab.context.close()

    # The student's kernel and workers end with the server.
    status, _ = hub.api("DELETE", f"/hub/api/users/{name}/server")
    assert status in (202, 204)

    wait_until(lambda: not students_processes((name,)), timeout=10)
    left = students_processes((name,))
    assert not left, f"processes of the student outlived the server: {left}"


def test_a_culled_servers_kernel_and_workers_end(culling_hub, pids):
    # jupyterhub-idle-culler stops a server idle for its timeout through the hub's API,
    # as an administrator's stop does: the cluster must go with it.
    hub, name = culling_hub, STUDENTS[0]
    token = hub.start_server(name)
    pids.add_tree(hub.server_pid(name))
    status, made = hub.api("POST", f"/user/{name}/api/kernels", {"name": "nbrpc"}, token=token)
    assert status == 201, made
    url = f"ws://127.0.0.1:{hub.port}/user/{name}/api/kernels/{made['id']}/channels"
    results = asyncio.run(run_cells(url, token, CELLS))
    assert [r["status"] for r in results] == ["ok", "ok", "ok"], results
    seen = json.loads(results[2]["out"].strip().splitlines()[-1])
    pids.add(seen["kernel"], *seen["workers"])

    culler = start_culler(hub)
    culled = wait_until(lambda: not hub.api("GET", f"/hub/api/users/{name}")[1]["servers"], timeout=90,
                        interval=0.5)
    culler.terminate()
    culler.wait(timeout=30)
    assert culled, f"the idle server was not culled:\n{hub.tail()}"
    assert f"Culling server {name}" in (hub.folder / "hub.log").read_text(errors="replace")
    stopped = time.monotonic()
    assert not wait_gone([seen["kernel"], *seen["workers"]], timeout=10), "the cluster outlived its culled server"
    print(f"\nculled: kernel and workers gone {time.monotonic() - stopped:.2f} s after the hub dropped the server")

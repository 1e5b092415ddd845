"""The side panel through a real JupyterHub, as a class meets it: two students, each logged
in at the hub's login page, each in JupyterLab on a server the hub spawned as that student
(``test_hub.Hub``: real Unix users, the local process spawner, nbrpc's server extension and
JupyterLab extension as ``pip install nbrpc`` brings them).

The first starts a cluster from the panel's form, sees it listed with its members and turns
it red with a deadlocked cell; the second's panel lists nothing of it, and the first's
endpoints refuse the second's token (403) while the second's own server knows no such kernel
(404). Every process of both students ends with their servers.
"""

from __future__ import annotations

import json
import os
import pwd
import time
import urllib.error
import urllib.request
from pathlib import Path

import nbformat
import pytest
from conftest import LOCK_CELL, wait_until
from test_browser import ARTIFACTS, chromium_tab, why_no_browser
from test_hub import STUDENTS, _running_hub, students_processes

pytestmark = [pytest.mark.hub, pytest.mark.browser, pytest.mark.slow]

A, B = STUDENTS[:2]
SETUP = "import threading\nimport torch.distributed.rpc as rpc"
KERNEL = "window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel"


@pytest.fixture
def hub(pids):
    reason = why_no_browser("lab")
    if reason:
        pytest.skip(reason)
    yield from _running_hub(pids, students=(A, B))


def wait_for(check, what: str, timeout: float = 30):
    value = wait_until(check, timeout, interval=0.2)
    assert value, f"timed out waiting for {what}"
    return value


def log_in(playwright, hub, name: str, path: str, profile: Path):
    """A browser of ``name``'s, logged in at the hub's login page, on ``/user/<name>/<path>``."""
    tab = chromium_tab(playwright, profile, 180_000)
    tab.errors = []
    tab.on("pageerror", lambda e: tab.errors.append(f"{e}: {e.stack}") if "nbrpc" in f"{e}{e.stack}" else None)
    tab.on("response", lambda r: tab.errors.append(f"{r.status} {r.url}")
           if r.status >= 400 and "/nbrpc/" in r.url else None)
    tab.goto(f"http://127.0.0.1:{hub.port}/hub/login?next=/user/{name}/{path}")
    tab.fill("#username_input", name)
    tab.fill("#password_input", "class")
    tab.click("#login_submit")
    tab.wait_for_function("() => window.jupyterapp?.shell !== undefined")
    assert tab.url.startswith(f"http://127.0.0.1:{hub.port}/user/{name}/lab"), tab.url
    # Once JupyterLab has restored its layout, the panel is in the left area: show it.
    tab.evaluate("async () => { await window.jupyterapp.restored; "
                 "window.jupyterapp.shell.activateById('nbrpc-panel'); }")
    return tab.context, tab


def panel_says(tab, what: str, check, timeout: float = 60):
    """Wait until ``check(panel)``; else fail with what the panel and the page said."""
    panel = tab.locator("#nbrpc-panel")
    if not wait_until(lambda: panel.count() == 1 and check(panel), timeout, interval=0.3):
        text = panel.inner_text() if panel.count() else "(no panel on the page)"
        pytest.fail(f"timed out waiting for {what}; the panel says: {text!r}; errors: {tab.errors}")
    return panel


def nbrpc_api(hub, owner: str, path: str, token: str, method: str = "GET") -> tuple[int, dict | None]:
    """(status, JSON) of ``owner``'s server's ``nbrpc/<path>`` through the hub's proxy, with ``token``."""
    request = urllib.request.Request(f"http://127.0.0.1:{hub.port}/user/{owner}/nbrpc/{path}", method=method,
                                     data=b"" if method == "POST" else None,
                                     headers={"Authorization": f"token {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read() or b"null")
    except urllib.error.HTTPError as e:
        e.close()
        return e.code, None


def test_a_class_uses_the_side_panel_through_the_hub(hub, pids, tmp_path):
    from playwright.sync_api import sync_playwright

    tokens = {name: hub.start_server(name) for name in (A, B)}
    for name in (A, B):
        pids.add_tree(hub.server_pid(name))
    entry = pwd.getpwnam(A)
    notebook = Path(entry.pw_dir) / "panel.ipynb"
    nbformat.write(nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(SETUP)],
        metadata={"kernelspec": {"name": "nbrpc", "display_name": "Python 3 (nbrpc)", "language": "python"}}),
        notebook)
    os.chown(notebook, entry.pw_uid, entry.pw_gid)

    with sync_playwright() as p:
        first, tab = log_in(p, hub, A, "lab/tree/panel.ipynb", tmp_path / "profile-a")
        try:
            tab.wait_for_function(f"() => {KERNEL}?.connectionStatus === 'connected' && {KERNEL}?.status === 'idle'")
            tab.evaluate(f"() => {{ window.__nbKernel = {KERNEL}; }}")
            kernel_id = tab.evaluate("() => window.__nbKernel.id")
            panel = panel_says(tab, "the empty panel", lambda p: p.locator(".nbrpc-empty").is_visible())

            # The form's start: the student's server runs the %rpc_init line in the notebook's kernel.
            panel.locator("input[name=workers]").fill("2")
            panel.locator(".nbrpc-start-button").click()
            message = panel.locator(".nbrpc-message")
            wait_for(lambda: message.inner_text().startswith("ran "), "the %rpc_init line to end", 300)
            assert message.inner_text() == "ran %load_ext nbrpc; %rpc_init -n 2"
            cluster = panel.locator(".nbrpc-cluster")
            wait_for(lambda: cluster.count() == 1 and "worker2" in cluster.inner_text(), "the members listed", 10)
            assert "panel.ipynb" in cluster.inner_text() and "master" in cluster.inner_text()
            pids.add(*[int(pid) for pid in cluster.locator("td:nth-child(3)").all_inner_texts() if pid.isdigit()])

            # A deadlocked cell turns it red, with the finding naming the worker.
            tab.evaluate("(code) => { window.__nbKernel.requestExecute({code}); }", SETUP + "\n" + LOCK_CELL)
            began = time.monotonic()
            stuck = panel.locator(".nbrpc-cluster.nbrpc-stuck")
            wait_for(lambda: stuck.count() == 1, "the cluster to turn red", 10)
            print(f"\nhub: the cluster red {time.monotonic() - began:.2f} s after the deadlocked cell began")
            assert "worker1" in panel.locator(".nbrpc-finding").inner_text()
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            tab.screenshot(path=str(ARTIFACTS / "hub-side-panel.png"))

            # The second student: a panel of their own, with nothing of the first's in it.
            second, other = log_in(p, hub, B, "lab", tmp_path / "profile-b")
            try:
                mine = panel_says(other, "the second student's empty panel",
                                  lambda p: p.locator(".nbrpc-empty").is_visible())
                other.wait_for_timeout(3000)  # three of the panel's refreshes
                assert mine.locator(".nbrpc-cluster").count() == 0
                assert "panel.ipynb" not in mine.inner_text() and "worker1" not in mine.inner_text()
                assert not other.errors, other.errors
            finally:
                second.close()
            assert nbrpc_api(hub, B, "clusters", tokens[B]) == (200, {"clusters": []})

            # The first's endpoints refuse the second's token; the second's server knows no such kernel.
            status, listed = nbrpc_api(hub, A, "clusters", tokens[A])
            assert status == 200 and [c["kernel_id"] for c in listed["clusters"]] == [kernel_id]
            for path, method in (("clusters", "GET"), (f"clusters/{kernel_id}/views/stacks", "GET"),
                                 (f"clusters/{kernel_id}/interrupt", "POST"),
                                 (f"clusters/{kernel_id}/shutdown", "POST")):
                assert nbrpc_api(hub, A, path, tokens[B], method)[0] == 403, path
            for path, method in ((f"clusters/{kernel_id}/views/stacks", "GET"),
                                 (f"clusters/{kernel_id}/interrupt", "POST"),
                                 (f"clusters/{kernel_id}/shutdown", "POST")):
                assert nbrpc_api(hub, B, path, tokens[B], method)[0] == 404, path
            assert stuck.count() == 1  # refused, and nothing was done to it

            # The first student stops the stuck call and shuts the cluster down from the panel.
            panel.locator(".nbrpc-stop").click()
            wait_for(lambda: stuck.count() == 0, "the red to clear", 60)
            panel.locator(".nbrpc-shutdown").click()
            panel.locator(".nbrpc-empty").wait_for(timeout=60_000)
            assert not tab.errors, tab.errors
        finally:
            first.close()

    for name in (A, B):
        status, _ = hub.api("DELETE", f"/hub/api/users/{name}/server")
        assert status in (202, 204)
    wait_until(lambda: not students_processes((A, B)), timeout=15)
    assert not students_processes((A, B)), f"processes of the students outlived their servers: " \
                                            f"{students_processes((A, B))}"

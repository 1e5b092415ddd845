"""The widgets as a person sees them: JupyterLab 4 in Debian's chromium, driven by Playwright.

JupyterLab runs headless on 127.0.0.1 (a free port, token auth, its own root, config,
runtime and settings directories) and opens a notebook that starts a two-worker
cluster and shows ``%rref_graph``. The test checks the nodes, hover details,
click-to-pin (read back from the kernel), the fork toggle, the worker filter and a
live update that arrives while a cell is still running, and saves screenshots under
build/browser/; the pictures of the documentation (``docs/_static/``: the RRef graph, the
autograd graph, the timeline) are these screenshots, copied there by ``picture``.
Jupyter Notebook 7, which loads the same extensions, shows the live graph too: its
nodes, click-to-pin and a live update. The RPC timeline of a traced
cluster gets the same: bars, hover details, wheel zoom with its axis, pin, and calls of
a still running cell appearing live. It also measures the first paint of
1,000 RRefs over 8 workers, and (no browser needed) ``nbrpc.rref_snapshot()`` of 1,000 RRefs on 8 worker kernels;
both print their numbers and add them to build/browser/perf.json.

The browser is the system's chromium (``apt-get install chromium``; Playwright never
downloads one). Without it, or without Playwright or JupyterLab, the browser tests
skip and say why (the Notebook 7 test also without ``notebook>=7``). At the end each
server, its kernels and their workers end by pid.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from importlib.metadata import version
from pathlib import Path

import nbformat
import pytest
import torch
import torch.distributed.rpc as rpc
from conftest import free_port, wait_gone, wait_until

import nbrpc
from nbrpc._util import kill_pids, pid_alive

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "build" / "browser"
# The documentation's pictures: made here, from the real views, never by hand.
PICTURES = REPO / "docs" / "_static"
TESTS = Path(__file__).resolve().parent
# What chromium needs here: root cannot use its sandbox, and nothing may reach out.
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
FIRST_PAINT_TARGET, SNAPSHOT_TARGET = 1.0, 0.5


def chromium_tab(playwright, profile, timeout: int, width: int = 1280, height: int = 800):
    """A tab of headless Chromium with a profile folder of its own; ``tab.context.close()``
    ends the browser."""
    context = playwright.chromium.launch_persistent_context(
        str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS,
        viewport={"width": width, "height": height})
    tab = context.pages[0] if context.pages else context.new_page()
    tab.set_default_timeout(timeout)
    return tab
# The timed tests run alone (the serial tier): twice a target allows a shared CI machine's
# noise, not an order of magnitude.
SLACK = 2

CELLS = [
    "%load_ext nbrpc",
    "%rpc_init --names p1,p2",
    "import nbrpc\nimport torch\nimport torch.distributed.rpc as rpc\n\n"
    "def owner_of(rref):\n    return rref.owner().name\n\n"
    "ra = rpc.remote('p1', torch.ones, args=((2, 3),))\n"
    "rb = rpc.remote('p2', torch.zeros, args=((4,),))\n"
    "rpc.rpc_sync('p2', owner_of, args=(ra,))  # forks ra to p2",
    "g = %rref_graph --interval 0.5\ng",
]
# The synthetic snapshot's module is imported once, before the clock starts.
BIG_SETUP = f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nfrom _snapshots import synthetic"
BIG_CELL = "from nbrpc.widgets import RRefGraph\nRRefGraph(snapshot=synthetic(1000, 8))"


def why_no_browser(app: str = "lab") -> str | None:
    """Why the browser tests of ``app`` ("lab" or "notebook") cannot run here, or None."""
    if not os.access(CHROMIUM, os.X_OK):
        return (f"no browser: {CHROMIUM} is missing; install Debian's chromium "
                "(apt-get install -y chromium, which .ci/run does where it can)")
    needed = [("playwright.sync_api", "playwright"), ("jupyterlab", "jupyterlab")]
    if app == "notebook":
        needed.append(("notebook", "notebook>=7"))
    for module, package in needed:
        try:
            __import__(module)
        except ImportError:
            return f"{package} is not installed; pip install -e '.[test]'"
    if app == "notebook" and int(version("notebook").split(".")[0]) < 7:
        return f"notebook {version('notebook')} is older than 7; pip install -e '.[test]'"
    return None


def report(line: str) -> None:
    """Print past pytest's capture: these numbers are the point of the run."""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    sys.__stdout__.write(f"\n[browser] {line} [load average {load}]\n")
    sys.__stdout__.flush()


def record(name: str, value) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / "perf.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = value
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


# -- the Jupyter server: JupyterLab or Notebook 7 -------------------------------------

# app: its title, module, the class whose ``expose_app_in_browser`` gives window.jupyterapp,
# and where a notebook opens. Notebook 7 is built on JupyterLab's extension system, so
# the same settings directory and flags isolate it.
APPS = {
    "lab": ("JupyterLab", "jupyterlab", "LabApp", "lab/tree"),
    "notebook": ("Jupyter Notebook 7", "notebook", "JupyterNotebookApp", "notebooks"),
}


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (kernels, and the workers they started)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


class Server:
    """A JupyterLab or Notebook 7 server of this test run: its URL, token and process."""

    def __init__(self, root: Path, app: str = "lab"):
        self.root, self.port, self.token = root, free_port(), secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.title, module, app_class, self.notebooks = APPS[app]
        settings = root / ".settings" / "@jupyterlab" / "notebook-extension"
        settings.mkdir(parents=True)
        # Every cell stays in the DOM (JupyterLab 4 may detach cells scrolled away).
        (settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
        # No news or update checks: nothing reaches out, no toast covers the screenshots.
        apputils = root / ".settings" / "@jupyterlab" / "apputils-extension"
        apputils.mkdir(parents=True)
        (apputils / "notification.jupyterlab-settings").write_text(
            '{"fetchNews": "false", "checkForUpdates": false}')
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(root / ".config"),
               "JUPYTER_RUNTIME_DIR": str(root / ".runtime"),
               "JUPYTERLAB_SETTINGS_DIR": str(root / ".settings"),
               "JUPYTERLAB_WORKSPACES_DIR": str(root / ".workspaces")}
        self.log = open(root / "server.log", "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
             f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
             f"--{app_class}.expose_app_in_browser=True",
             "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
             "--LabApp.extension_manager=readonly", "--ServerApp.terminals_enabled=False",
             *(["--allow-root"] if os.geteuid() == 0 else [])],
            cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def api(self, path: str, method: str = "GET"):
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                self.api("/api/status")
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"{self.title} did not start; its log:\n{self.log_text()}")

    def log_text(self) -> str:
        return (self.root / "server.log").read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        """Shut kernels down through the server, then end every process below it by pid."""
        pids = descendants(self.process.pid)
        try:
            for kernel in self.api("/api/kernels"):
                self.api(f"/api/kernels/{kernel['id']}", method="DELETE")
        except OSError:
            pass
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        kill_pids([p for p in pids if pid_alive(p)])
        self.log.close()
        left = wait_gone(pids)
        assert not left, f"processes of {self.title} survived: {sorted(left)}"


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    """JupyterLab, or the app a test names by parametrizing ``server`` indirectly.

    A new app ends the one before (and the page on it) first: one server at a time.
    """
    app = getattr(request, "param", "lab")
    reason = why_no_browser(app)
    if reason:
        report(f"SKIPPED: {reason}")
        pytest.skip(reason)
    root = tmp_path_factory.mktemp(app)
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(c) for c in CELLS],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(notebook, root / "graph.ipynb")
    server = Server(root, app)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def page(server, tmp_path_factory):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        tab = chromium_tab(p, tmp_path_factory.mktemp("chromium-profile"), 120_000, 1400, 1000)
        try:
            tab.goto(f"{server.url}/{server.notebooks}/graph.ipynb?token={server.token}")
            tab.wait_for_function(
                "() => window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel"
                "?.connectionStatus === 'connected'")
            yield tab
        finally:
            tab.context.close()


# -- talking to the notebook's kernel -------------------------------------------------

KERNEL = "window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"


def picture(locator, name: str) -> None:
    """Screenshot ``locator`` into build/browser/ and as the documentation's picture ``name``."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    locator.screenshot(path=str(ARTIFACTS / name))
    PICTURES.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(ARTIFACTS / name, PICTURES / name)


def evaluate(page, expression: str):
    """The value of ``expression`` in the notebook's kernel (as JSON)."""
    reply = page.evaluate(
        f"""async (expression) => {{
            const future = {KERNEL}.requestExecute(
                {{code: '', silent: true, store_history: false,
                  user_expressions: {{value: `__import__('json').dumps(${{expression}})`}}}});
            return (await future.done).content;
        }}""", expression)
    value = reply["user_expressions"]["value"]
    assert value["status"] == "ok", value
    return json.loads(eval(value["data"]["text/plain"]))


def start_execute(page, code: str) -> None:
    """Start ``code`` in the notebook's kernel without waiting for it."""
    page.evaluate(f"(code) => {{ window.__nbrpcBusy = {KERNEL}.requestExecute({{code}}).done; }}", code)


def wait_executed(page) -> dict:
    return page.evaluate("async () => (await window.__nbrpcBusy).content")


def wait_for(check, what: str, timeout: float = 30):
    """``check()``'s value once true; fail naming ``what`` if it is not within ``timeout`` s."""
    value = wait_until(check, timeout, interval=0.1)
    assert value, f"timed out waiting for {what}"
    return value


def run_new_cell(page, source: str):
    """Add a code cell at the end of the notebook, run it, and return its locator."""
    page.evaluate("""(source) => {
        const app = window.jupyterapp;
        const notebook = app.shell.currentWidget.content;
        notebook.model.sharedModel.insertCell(notebook.widgets.length, {cell_type: 'code', source});
        notebook.activeCellIndex = notebook.widgets.length - 1;
        app.commands.execute('notebook:run-cell');
    }""", source)
    return page.locator(".jp-Cell").last


def node(page, rref_id: str):
    return page.locator(f'.nbrpc-host [data-id="{rref_id}"]').first


# -- the tests -----------------------------------------------------------------------


def show_rref_graph(page) -> tuple[str, str]:
    """Run all cells; check the graph shows the notebook's two RRefs, coloured by owner."""
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_selector(".nbrpc-graph .nbrpc-host [data-id]", timeout=180_000)
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    assert "Error" not in " ".join(errors.all_inner_texts())

    expected = evaluate(page, "sorted([r['id'], r['owner']] for r in nbrpc.rref_snapshot()['rrefs'])")
    ra, rb = evaluate(page, "[nbrpc.recording.rref_ledger.rref_id(ra), nbrpc.recording.rref_ledger.rref_id(rb)]")
    assert sorted(owner for _, owner in expected) == ["p1", "p2"]
    wait_for(lambda: page.locator(".nbrpc-host [data-id]").count() == 2, what="the two RRefs")
    shown = page.eval_on_selector_all(".nbrpc-host [data-id]",
                                      "nodes => nodes.map(n => [n.dataset.id, n.getAttribute('fill')])")
    assert sorted(i for i, _ in shown) == sorted(i for i, _ in expected)
    assert len({fill for _, fill in shown}) == 2  # coloured by owner
    assert page.locator(".nbrpc-host [data-lane]").count() == 3
    assert "live, every 0.5 s" in page.locator(".nbrpc-status").inner_text()
    return ra, rb


def pin(page, rref_id: str) -> None:
    """Click a node: it is pinned, and the kernel sees the selection."""
    node(page, rref_id).click()
    page.locator(".nbrpc-pin").wait_for(state="visible")
    assert f"RRef {rref_id}" in page.locator(".nbrpc-pin").inner_text()
    wait_for(lambda: evaluate(page, "g.selected") == rref_id, what="g.selected in the kernel")


def live_update(page, pinned: str) -> float:
    """A new RRef appears while the cell that made it still runs; ``pinned`` stays pinned.

    Returns the seconds from the cell's start to the new node.
    """
    start_execute(page, "rc = rpc.remote('p1', torch.ones, args=((5,),))\nimport time\ntime.sleep(15)")
    began = time.monotonic()
    wait_for(lambda: page.locator(".nbrpc-host [data-id]").count() == 3, timeout=12,
               what="the new RRef while the cell runs")
    seen_after = time.monotonic() - began
    assert evaluate_busy(page), "the cell had already finished: the update did not come while busy"
    assert wait_executed(page)["status"] == "ok"
    rc = evaluate(page, "nbrpc.recording.rref_ledger.rref_id(rc)")
    assert node(page, rc).count() == 1
    # the pinned RRef stays pinned across refreshes
    assert node(page, pinned).get_attribute("class").split().count("nbrpc-selected") == 1
    assert page.locator(".nbrpc-pin").is_visible()
    return seen_after


def test_rref_graph_in_jupyterlab(page):
    ra, rb = show_rref_graph(page)

    # hover shows the details
    node(page, ra).hover()
    tip = page.locator(".nbrpc-tip")
    tip.wait_for(state="visible")
    text = tip.inner_text()
    for expected_text in (f"RRef {ra}", "p1", "Tensor[2, 3] float32", "24 B", "master", "rpc.remote('p1'"):
        assert expected_text in text, (expected_text, text)

    pin(page, ra)

    # fork history: not drawn, and no room kept for it over the lanes; the toggle draws
    # it (the kernel hears of it and redraws with the arcs' band)
    fork = page.locator(".nbrpc-host .nbrpc-fork").first
    lane_top = page.locator(".nbrpc-host [data-lane] > rect").first
    assert fork.count() == 0 and lane_top.get_attribute("y") == "12"
    page.locator(".nbrpc-forks-toggle input").check()
    fork.wait_for(state="visible")
    assert float(lane_top.get_attribute("y")) > 12
    wait_for(lambda: evaluate(page, "g.show_forks") is True, what="g.show_forks in the kernel")

    # the worker filter: p2 owns rb; ra went to p2 only for one call, so p2 holds it no more
    page.locator(".nbrpc-filter").select_option("p2")
    node(page, ra).wait_for(state="hidden")
    assert node(page, rb).is_visible()
    page.locator(".nbrpc-filter").select_option("p1")
    node(page, rb).wait_for(state="hidden")
    assert node(page, ra).is_visible()
    wait_for(lambda: evaluate(page, "g.worker") == "p1", what="g.worker in the kernel")
    page.locator(".nbrpc-filter").select_option("")
    node(page, rb).wait_for(state="visible")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    picture(page.locator(".nbrpc-graph").first, "rref_graph.png")

    seen_after = live_update(page, pinned=ra)
    report(f"live update seen {seen_after:.2f} s after the busy cell started")
    page.screenshot(path=str(ARTIFACTS / "rref_graph_page.png"), full_page=True)


def evaluate_busy(page) -> bool:
    return page.evaluate(f"() => {KERNEL}.status === 'busy'")


PAINT = """async (source) => {
    const app = window.jupyterapp;
    const notebook = app.shell.currentWidget.content;
    const index = notebook.widgets.length;
    notebook.model.sharedModel.insertCell(index, {cell_type: 'code', source});
    notebook.activeCellIndex = index;
    const frame = () => new Promise((done) => requestAnimationFrame(done));
    const began = performance.now();
    app.commands.execute('notebook:run-cell');
    const cell = notebook.widgets[index].node;
    while (cell.querySelectorAll('.nbrpc-host [data-id]').length < 1000) await frame();
    await frame();  // the frame that draws the nodes, and the one after it
    await frame();
    return (performance.now() - began) / 1000;
}"""


def test_first_paint_of_1000_rrefs_over_8_workers(page):
    """From running a cell to 1,000 RRef nodes painted: kernel, transport and browser.

    Measured three times, each in a new cell (removed after it), with the cluster and
    the live graph of the test above still running, as a user would have them; the
    median counts.
    """
    start_execute(page, BIG_SETUP)
    assert wait_executed(page)["status"] == "ok"
    times = []
    for run in range(3):
        times.append(page.evaluate(PAINT, BIG_CELL))
        assert page.locator(".jp-Cell").last.locator(".nbrpc-host [data-id]").count() == 1000
        if run < 2:  # each run paints into a page as light as the first had
            page.evaluate("() => { const nb = window.jupyterapp.shell.currentWidget.content;"
                          " nb.model.sharedModel.deleteCell(nb.widgets.length - 1); }")
    big = page.locator(".jp-Cell").last
    # Past 200 RRefs the widget bundles holder edges; an RRef's own light up on hover.
    assert big.locator(".nbrpc-bundle").count() == 14
    big.locator('.nbrpc-host [data-id="0:1"]').hover()
    big.locator('.nbrpc-quiet.nbrpc-lit[data-rref="0:1"]').first.wait_for(state="visible")
    big.locator(".nbrpc-graph").screenshot(path=str(ARTIFACTS / "rref_graph_1000.png"))
    median = sorted(times)[1]
    verdict = "met" if median < FIRST_PAINT_TARGET else "NOT met"
    report(f"first paint, 1,000 RRefs over 8 workers: median {median:.3f} s of "
           f"{', '.join(f'{t:.3f}' for t in times)} (target {FIRST_PAINT_TARGET:g} s: {verdict})")
    record("first_paint_1000_rrefs_s", {"median": round(median, 3), "runs": [round(t, 3) for t in times]})
    assert median < SLACK * FIRST_PAINT_TARGET, f"first paint took {median:.3f} s (median of {times})"


def test_autograd_graph_in_jupyterlab(page):
    source = BIG_SETUP.replace("synthetic", "AUTOGRAD") + (
        "\nfrom nbrpc.widgets import AutogradGraph\nag = AutogradGraph(AUTOGRAD)\nag")
    cell = run_new_cell(page, source)
    cell.locator('.nbrpc-host [data-id="w1:2"]').wait_for(state="visible")
    assert cell.locator(".nbrpc-host [data-id]").count() == 9
    assert cell.locator(".nbrpc-host .nbrpc-rpc").count() == 2
    assert cell.locator(".nbrpc-forks-toggle").count() == 0  # RRef graphs only
    cell.locator('.nbrpc-host [data-id="w1:2"]').hover()
    tip = cell.locator(".nbrpc-tip")
    tip.wait_for(state="visible")
    assert "fc1.weight" in tip.inner_text() and "0.53" in tip.inner_text()
    # hovering lights the edges of the function
    assert cell.locator('.nbrpc-lit[data-dst="w1:2"]').count() == 1
    cell.locator('.nbrpc-host [data-id="w1:4"]').click()
    wait_for(lambda: evaluate(page, "ag.selected") == "w1:4", what="ag.selected in the kernel")
    cell.locator(".nbrpc-filter").select_option("w1")
    cell.locator('.nbrpc-host [data-id="master:0"]').wait_for(state="hidden")
    assert cell.locator('.nbrpc-host [data-id="w1:0"]').is_visible()
    cell.locator(".nbrpc-filter").select_option("")
    picture(cell.locator(".nbrpc-graph"), "autograd_graph.png")


TIMELINE_CELL = """%load_ext nbrpc
import time
import nbrpc
import torch.distributed.rpc as rpc
if nbrpc.current() is not None:  # the RRef graph's cluster records nothing
    nbrpc.current().shutdown()
%rpc_init --names p1,p2 --trace

def spin(seconds):
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        pass
    return seconds

[f.wait() for f in [rpc.rpc_async(w, spin, args=(0.05,)) for w in ('p1', 'p2', 'p1')]]
tl = %rpc_timeline --live
tl"""


def ticks(cell) -> list[str]:
    return cell.locator(".nbrpc-host .nbrpc-tl-tick").all_inner_texts()


def shown_share(cell) -> float:
    """The share of the timeline's window in view: the plot's viewBox width over its own."""
    plot = cell.locator(".nbrpc-host .nbrpc-tl-plot")
    return round(float(plot.get_attribute("viewBox").split()[2]) / float(plot.get_attribute("width")), 3)


def test_timeline_in_jupyterlab(page):
    """A traced cluster's calls on the timeline: bars, hover, zoom, pin, a live update."""
    cell = run_new_cell(page, TIMELINE_CELL)
    cell.locator(".nbrpc-timeline-view .nbrpc-host [data-id]").first.wait_for(timeout=180_000)
    spins = evaluate(page, "sorted(c['id'] for c in tl.snapshot['calls'] if c['name'].endswith('spin'))")
    assert len(spins) == 3
    for call_id in spins:
        assert cell.locator(f'.nbrpc-host [data-id="{call_id}"]').count() == 1
    lanes = cell.locator(".nbrpc-host [data-lane]").evaluate_all("ns => ns.map(n => n.dataset.lane)")
    assert lanes == ["master", "p1", "p2"]
    assert "live, every 1 s" in cell.locator(".nbrpc-status").inner_text()
    assert "spin" in cell.locator(".nbrpc-tl-summary").inner_text()

    # hover: the call's details
    bar = cell.locator(f'.nbrpc-host [data-id="{spins[0]}"]')
    bar.hover()
    tip = cell.locator(".nbrpc-tip")
    tip.wait_for(state="visible")
    for expected in ("spin on p", "queueing delay", "master \u2192 p", "rpc_async", "ran for"):
        assert expected in tip.inner_text(), (expected, tip.inner_text())

    # zoom with the wheel: the axis changes; "show all" brings it back
    before = ticks(cell)
    plot = cell.locator(".nbrpc-host .nbrpc-tl-plot")

    steps = []  # what each wheel step met, for the message if the zoom never shows

    def wheel_in() -> bool:
        # Where the plot is now: the live refresh redraws it every second, and may move it
        # or replace it between two steps (then the next try finds the new one).
        from playwright.sync_api import Error as PlaywrightError

        try:
            plot.scroll_into_view_if_needed(timeout=5_000)
            box = plot.bounding_box()
        except PlaywrightError as e:
            if "not attached" not in str(e):
                raise
            steps.append("the plot was replaced")
            return False
        if box is None:
            steps.append("the plot had no box")
            return False
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        page.mouse.move(x, y)
        page.mouse.wheel(0, -300)
        page.wait_for_timeout(50)
        under = page.evaluate("([x, y]) => { const e = document.elementFromPoint(x, y);"
                              " return e ? `${e.tagName}.${e.getAttribute('class')}` : null; }", [x, y])
        share, now = shown_share(cell), ticks(cell)
        steps.append(f"at ({x:.0f}, {y:.0f}) over {under}: share {share}, ticks {now}")
        return now != before and share < 0.5

    assert wait_until(wheel_in, timeout=30, interval=0.1), \
        "the axis did not follow the zoom; the wheel steps met:\n" + "\n".join(steps[-8:])
    assert 0 < shown_share(cell) < 0.5  # a few wheel steps in: under half the window shows
    cell.locator(".nbrpc-tl-reset").click()
    wait_for(lambda: shown_share(cell) == 1, timeout=5, what="show all")

    # click to pin: the kernel hears of it
    bar.click()
    wait_for(lambda: evaluate(page, "tl.selected") == spins[0], what="tl.selected in the kernel")
    cell.locator(".nbrpc-pin").wait_for(state="visible")
    picture(cell.locator(".nbrpc-timeline-view"), "timeline.png")

    # live: calls made by a cell that is still running appear
    start_execute(page, "futs = [rpc.rpc_async('p2', spin, args=(0.2,)) for _ in range(2)]\n"
                        "[f.wait() for f in futs]\ntime.sleep(8)")
    began = time.monotonic()
    wait_for(lambda: cell.locator(".nbrpc-host .nbrpc-tl-bar").count() >= len(spins) + 2, timeout=8,
               what="the new calls while the cell runs")
    seen_after = time.monotonic() - began
    assert evaluate_busy(page), "the cell had already finished: the update did not come while busy"
    assert wait_executed(page)["status"] == "ok"
    assert cell.locator(".nbrpc-pin").is_visible()  # the pin survives refreshes
    report(f"timeline: live update seen {seen_after:.2f} s after the busy cell started")
    page.mouse.move(0, 0)
    cell.locator(".nbrpc-timeline-view").screenshot(path=str(ARTIFACTS / "timeline_live.png"))
    evaluate(page, "tl.stop() or 0")


def test_snapshot_time_1000_rrefs_over_8_workers():
    """``nbrpc.rref_snapshot()`` of 1,000 live RRefs owned by 8 worker kernels."""
    cluster = nbrpc.start(8, progress=None, timeout=60, startup_timeout=120)
    try:
        workers = [w.name for w in cluster.workers]
        held = [rpc.remote(workers[k % 8], torch.ones, args=((k % 7 + 1, 4),)) for k in range(1000)]
        assert [h.to_here().shape[1] for h in held[-8:]] == [4] * 8
        nbrpc.rref_snapshot()  # the first one asks owners for value summaries
        times = []
        for _ in range(5):
            began = time.perf_counter()
            snapshot = nbrpc.rref_snapshot()
            times.append(time.perf_counter() - began)
        assert len(snapshot["rrefs"]) == 1000
        best, median = min(times), sorted(times)[2]
        verdict = "met" if median < SNAPSHOT_TARGET else "NOT met"
        report(f"rref_snapshot, 1,000 RRefs over 8 workers: median {median:.3f} s, best {best:.3f} s "
               f"(target {SNAPSHOT_TARGET:g} s: {verdict})")
        record("rref_snapshot_1000_rrefs_s", {"median": round(median, 3), "best": round(best, 3)})
        assert median < SLACK * SNAPSHOT_TARGET, f"rref_snapshot took {median:.3f} s (median of {times})"
        del held, snapshot  # and let the owners hear of it before they leave
        deadline = time.monotonic() + 30
        while nbrpc.rref_snapshot()["rrefs"] and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        cluster.shutdown()


@pytest.mark.parametrize("server", ["notebook"], indirect=True)
def test_rref_graph_in_notebook7(page):
    """The same notebook in Jupyter Notebook 7: anywidget's prebuilt extension loads there."""
    ra, _ = show_rref_graph(page)
    pin(page, ra)
    seen_after = live_update(page, pinned=ra)
    report(f"Notebook 7: live update seen {seen_after:.2f} s after the busy cell started")
    page.mouse.move(0, 0)  # the hover details would cover the pinned ones
    page.screenshot(path=str(ARTIFACTS / "rref_graph_notebook7.png"), full_page=True)


@pytest.fixture(autouse=True, scope="module")
def _browser_artifacts_dir():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    yield
    if not any(ARTIFACTS.iterdir()):
        shutil.rmtree(ARTIFACTS)

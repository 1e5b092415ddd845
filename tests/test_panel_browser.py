"""The JupyterLab side panel as a person sees it: JupyterLab 4 in Debian's chromium,
driven by Playwright, at 1280x800 in the Light and the Dark theme.

A notebook starts a cluster from the panel's form (the server runs its ``%rpc_init`` line
in the notebook's kernel; the panel says what it ran); the panel names its members; a
deadlocked cell turns the cluster red and raises a notification naming the notebook within
3 s while its kernel is busy; the wait-for graph and the stacks open from the panel while
the cell is stuck; the stop button ends the stuck call; the RRef graph and the timeline
open as panels; shutting the cluster down removes it, and its open views say it ended. No
console errors. The Light run saves docs/_static/side-panel.png and, of the docked RRef
graph's hover card, side-panel-card.png. A docked view comes back
after a reload; a hidden page asks the server nothing, and a stuck cell's notification
comes within 3 s of the page being visible again. Every process ends by pid
(``Server.stop``)."""

from __future__ import annotations

import time

import nbformat
import pytest
from conftest import LOCK_CELL, wait_until
from test_browser import REPO, Server, chromium_tab, report, why_no_browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SETUP = "import threading\nimport torch\nimport torch.distributed.rpc as rpc"
REMOTE_CELL = "r = rpc.remote('worker2', torch.ones, args=((2, 3),))\nr.to_here()"
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}
SCREENSHOT = REPO / "docs" / "_static" / "side-panel.png"
CARD_SCREENSHOT = REPO / "docs" / "_static" / "side-panel-card.png"
# The notebook's kernel, kept once the page is up: views opened later become the current widget.
KERNEL = "window.__nbKernel"


@pytest.fixture
def lab(request, tmp_path):
    """JupyterLab, or Jupyter Notebook 7 where a test parametrizes ``lab`` with "notebook"."""
    app = getattr(request, "param", "lab")
    reason = why_no_browser(app)
    if reason:
        report(f"SKIPPED: {reason}")
        pytest.skip(reason)
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(SETUP)],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(notebook, tmp_path / "panel.ipynb")
    server = Server(tmp_path, app)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture
def page(lab, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        tab = chromium_tab(p, tmp_path / "chromium-profile", 60_000)
        try:
            tab.errors = []
            tab.on("console", lambda m: tab.errors.append(m.text) if m.type == "error" else None)
            tab.on("pageerror", lambda e: tab.errors.append(f"{e}: {e.stack}"))
            tab.on("response", lambda r: tab.errors.append(f"{r.status} {r.url}") if r.status >= 400 else None)
            tab.goto(f"{lab.url}/{lab.notebooks}/panel.ipynb?token={lab.token}")
            kernel = "window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel"
            tab.wait_for_function(
                f"() => {kernel}?.connectionStatus === 'connected' && {kernel}?.status === 'idle'",
                timeout=120_000)
            tab.evaluate(f"() => {{ {KERNEL} = {kernel}; }}")
            yield tab
        finally:
            tab.context.close()


def wait_for(check, what: str, timeout: float = 30):
    value = wait_until(check, timeout, interval=0.1)
    assert value, f"timed out waiting for {what}"
    return value


def kernel_idle(page) -> bool:
    return page.evaluate(f"() => {KERNEL}.status === 'idle'")


def run_in_kernel(page, code: str) -> None:
    """Run ``code`` in the notebook's kernel without waiting for it (as a cell would)."""
    page.evaluate(f"(code) => {{ {KERNEL}.requestExecute({{code}}); }}", code)


@pytest.mark.parametrize("theme", sorted(THEMES))
def test_side_panel(page, theme):
    timings = {}
    page.evaluate("(t) => window.jupyterapp.commands.execute('apputils:change-theme', {theme: t})", THEMES[theme])
    page.evaluate("() => window.jupyterapp.shell.activateById('nbrpc-panel')")
    panel = page.locator("#nbrpc-panel")
    panel.locator(".nbrpc-empty").wait_for()

    # Start a cluster from the form: the notebook gets the %rpc_init line and runs it.
    panel.locator("input[name=workers]").fill("2")
    panel.locator("input[name=trace]").check()
    panel.locator(".nbrpc-start-button").click()
    message = panel.locator(".nbrpc-message")
    wait_for(lambda: "%rpc_init -n 2 --trace" in message.inner_text(), "the panel to say what it starts", 10)
    wait_for(lambda: message.inner_text().startswith("ran ") and kernel_idle(page), "the %rpc_init line to end",
             timeout=240)
    assert message.inner_text() == "ran %load_ext nbrpc; %rpc_init -n 2 --trace"
    ended = time.monotonic()
    entry = panel.locator(".nbrpc-cluster")
    wait_for(lambda: entry.count() == 1 and "worker2" in entry.inner_text(), "the members in the panel", 10)
    timings["members shown after %rpc_init"] = time.monotonic() - ended
    text = entry.inner_text()
    assert "panel.ipynb" in text and all(n in text for n in ("master", "worker1", "worker2"))
    page.evaluate(f"(c) => {KERNEL}.requestExecute({{code: c}})", SETUP + "\n" + REMOTE_CELL)
    wait_for(lambda: kernel_idle(page), "the RRef cell")

    # The RRef graph and the timeline as panels, drawn by the widgets' code.
    entry.locator(".nbrpc-open-rref-graph").click()
    page.locator(".nbrpc-view svg[data-kind=rref]").wait_for()
    hover_pin_and_filter_docked(page, CARD_SCREENSHOT if theme == "light" else None)
    entry.locator(".nbrpc-open-timeline").click()
    page.locator(".nbrpc-view svg[data-kind=timeline]").wait_for()
    if theme == "light":
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOT))

    # A deadlocked cell: red, a notification naming the notebook, while the kernel is busy.
    began = time.monotonic()
    run_in_kernel(page, LOCK_CELL)
    wait_for(lambda: panel.locator(".nbrpc-cluster.nbrpc-stuck").count() == 1, "the cluster to turn red", 10)
    timings["red after the cell began"] = time.monotonic() - began
    toast = page.locator(".Toastify__toast", has_text="panel.ipynb")
    toast.wait_for(timeout=10_000)
    timings["notification after the cell began"] = time.monotonic() - began
    assert page.evaluate(f"() => {KERNEL}.status") == "busy"
    assert "worker1" in panel.locator(".nbrpc-finding").inner_text()
    toast.get_by_text("Wait-for graph").click()
    page.locator(".nbrpc-view svg[data-kind=waits]").wait_for()
    page.locator(".nbrpc-view svg[data-kind=waits] .nbrpc-alarm").first.wait_for(state="attached")
    panel.locator(".nbrpc-open-stacks").click()
    page.locator(".nbrpc-view .nbrpc-stacks", has_text="outer").wait_for()
    panel.locator(".nbrpc-stop").click()
    wait_for(lambda: kernel_idle(page), "the stop button to end the stuck call", 60)
    wait_for(lambda: panel.locator(".nbrpc-cluster.nbrpc-stuck").count() == 0, "the red to clear", 10)

    # Shut down: the cluster leaves the panel; its views say it ended.
    panel.locator(".nbrpc-shutdown").click()
    panel.locator(".nbrpc-empty").wait_for(timeout=60_000)
    page.locator(".nbrpc-view.nbrpc-ended").first.wait_for(timeout=10_000)
    report(f"side panel ({theme}): " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))
    assert timings["members shown after %rpc_init"] < 3.0, timings
    assert timings["red after the cell began"] < 3.0, timings
    assert timings["notification after the cell began"] < 3.0, timings
    assert not page.errors, page.errors


def hover_pin_and_filter_docked(page, picture=None) -> None:
    """The docked RRef graph is the widget's own front end: hovering the RRef shows its card
    (naming its owner), a click pins it and the pin outlives the view's refreshes, the worker
    filter dims it, and fit / 1:1 switches the drawing's size. ``picture``: where to save the
    hover card's picture (the docs')."""
    view = page.locator(".nbrpc-view", has=page.locator("svg[data-kind=rref]"))
    rref = view.locator(".nbrpc-host [data-id]")
    assert rref.count() == 1
    assert view.locator("title").count() == 0  # the widget's cards, not the browser's tooltips
    rref.hover()
    tip = view.locator(".nbrpc-tip")
    wait_for(lambda: tip.is_visible() and "owner" in tip.inner_text(), "the hover card", 10)
    rows = dict(line.split("\t", 1) for line in tip.inner_text().splitlines() if "\t" in line)
    assert rows["owner"] == "worker2" and rows["holders"] == "master", rows
    if picture is not None:
        page.screenshot(path=str(picture), clip={"x": 764, "y": 30, "width": 482, "height": 420})
    rref.click()
    pin = view.locator(".nbrpc-pin")
    wait_for(lambda: pin.is_visible() and "worker2" in pin.inner_text(), "the pinned card", 10)
    asked = page.evaluate("() => performance.getEntriesByType('resource').filter("
                          "e => e.name.includes('/views/rref')).length")
    wait_for(lambda: page.evaluate("() => performance.getEntriesByType('resource').filter("
                                   "e => e.name.includes('/views/rref')).length") >= asked + 2,
             "two refreshes of the docked view", 10)
    assert pin.is_visible() and "nbrpc-selected" in rref.get_attribute("class")
    view.locator("select.nbrpc-filter").select_option("worker1")
    wait_for(lambda: "nbrpc-off" in rref.get_attribute("class"), "the filter to dim the RRef", 5)
    view.locator("select.nbrpc-filter").select_option("")
    assert view.locator(".nbrpc-host.nbrpc-fit").count() == 1
    view.locator(".nbrpc-fit-toggle").click()
    assert view.locator(".nbrpc-host.nbrpc-fit").count() == 0
    view.locator(".nbrpc-fit-toggle").click()
    assert view.locator(".nbrpc-host.nbrpc-fit").count() == 1
    rref.click()  # unpinned again
    wait_for(lambda: not pin.is_visible(), "the pin to go", 5)


@pytest.mark.parametrize("lab", ["notebook"], indirect=True)
def test_side_panel_in_notebook_7(page):
    page.evaluate("() => window.jupyterapp.shell.activateById('nbrpc-panel')")
    panel = page.locator("#nbrpc-panel")
    panel.locator(".nbrpc-empty").wait_for()
    page.evaluate(f"(c) => {KERNEL}.requestExecute({{code: c}})", "%load_ext nbrpc\n%rpc_init -n 1")
    wait_for(lambda: "worker1" in panel.inner_text(), "the members in the panel", 240)
    assert "panel.ipynb" in panel.locator(".nbrpc-cluster").inner_text()
    panel.locator(".nbrpc-open-status").click()
    page.locator(".nbrpc-view .nbrpc-status").wait_for()
    panel.locator(".nbrpc-shutdown").click()
    panel.locator(".nbrpc-empty").wait_for(timeout=60_000)
    # Notebook 7.6's own page throws this at load, with nbrpc's extension disabled too.
    errors = [e for e in page.errors if not ("reading 'schema'" in e and "notebook_core" in e)]
    assert not errors, errors


HIDE = """(hidden) => {
    const state = hidden ? 'hidden' : 'visible';
    Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => state});
    Object.defineProperty(document, 'hidden', {configurable: true, get: () => hidden});
    document.dispatchEvent(new Event('visibilitychange'));
}"""


def saved_views(lab) -> list[str]:
    """The views the layout restorer saved in the workspace (what a reload opens again)."""
    workspaces = lab.api("/lab/api/workspaces")["workspaces"]["values"]
    return [key for w in workspaces for key in w["data"] if key.startswith("nbrpc-views:")]


def test_views_come_back_after_a_reload_and_a_hidden_page_stands_by(lab, page):
    page.evaluate("() => window.jupyterapp.shell.activateById('nbrpc-panel')")
    panel = page.locator("#nbrpc-panel")
    panel.locator(".nbrpc-empty").wait_for()
    run_in_kernel(page, "%load_ext nbrpc\n%rpc_init -n 1\n" + SETUP)
    wait_for(lambda: "worker1" in panel.inner_text() and kernel_idle(page), "the members in the panel", 240)
    panel.locator(".nbrpc-open-status").click()
    page.locator(".nbrpc-view .nbrpc-status").wait_for()

    # A reload: the layout restorer opens the docked view again, and it draws.
    wait_for(lambda: saved_views(lab), "the workspace to hold the view", 30)
    page.reload()
    notebook = ("[...window.jupyterapp.shell.widgets('main')].find(w => w.sessionContext)"
                "?.sessionContext.session?.kernel")
    page.wait_for_function(f"() => {notebook}?.connectionStatus === 'connected'", timeout=120_000)
    page.evaluate(f"() => {{ {KERNEL} = {notebook}; }}")
    page.locator(".nbrpc-view .nbrpc-status").wait_for(timeout=60_000)
    assert "panel.ipynb" in page.locator(".lm-TabBar-tab", has_text="Status").first.inner_text()
    # Hidden: no request at all, not even for a stuck cell; visible again: the notification.
    # (Playwright hands events over while it waits, in order: wait_for_timeout, not sleep.)
    phase, asked = ["visible"], []
    page.on("request", lambda r: asked.append((phase[0], r.url)) if "/nbrpc/" in r.url else None)
    page.evaluate(HIDE, True)
    page.wait_for_timeout(500)  # a request already under way may still go out
    phase[0] = "hidden"
    run_in_kernel(page, LOCK_CELL)
    page.wait_for_timeout(5000)
    phase[0] = "visible"
    assert [url for when, url in asked if when == "hidden"] == [], "the hidden page asked the server"
    assert page.locator(".Toastify__toast", has_text="panel.ipynb").count() == 0
    shown = time.monotonic()
    page.evaluate(HIDE, False)
    page.locator(".Toastify__toast", has_text="panel.ipynb").wait_for(timeout=10_000)
    took = time.monotonic() - shown
    report(f"side panel: the stuck notification {took:.2f} s after the page was visible again")
    assert took < 3.0, took
    panel.locator(".nbrpc-stop").click()
    panel.locator(".nbrpc-shutdown").click()
    panel.locator(".nbrpc-empty").wait_for(timeout=60_000)
    page.locator(".nbrpc-view.nbrpc-ended").first.wait_for(timeout=10_000)
    assert not page.errors, page.errors

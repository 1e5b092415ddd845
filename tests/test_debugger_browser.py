"""JupyterLab's debugger across the cluster as a person uses it: JupyterLab 4 in Debian's
chromium, driven by Playwright.

A notebook starts a one-worker cluster, the person switches the notebook's debugger on
(the bug in its toolbar), sets a breakpoint by clicking the gutter of a line of a cell's
function, runs a cell that calls the function on worker1, sees worker1's thread in the
Callstack and the function's local in the Variables panel, and continues: the cell gets
the call's value. The stopped debugger is the documentation's picture
(``docs/_static/debugger.png``). The server, its kernel and the worker end by pid
(``Server.stop``).
"""

from __future__ import annotations

import nbformat
import pytest
from test_browser import Server, chromium_tab, picture, report, why_no_browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# torch and the cluster come before the debugger: under it every line is traced.
SETUP = "%load_ext nbrpc\nimport torch.distributed.rpc as rpc\n%rpc_init -n 1"
FUNCTION = "def f(x):\n    y = x + 1\n    return y * 2"
CALL = "rpc.rpc_sync('worker1', f, args=(3,))"
NOTEBOOK = "window.jupyterapp.shell.currentWidget"


@pytest.fixture
def lab(tmp_path):
    reason = why_no_browser()
    if reason:
        report(f"SKIPPED: {reason}")
        pytest.skip(reason)
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(c) for c in (SETUP, FUNCTION, CALL)],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    root = tmp_path / "notebooks"  # the chromium profile beside it, not in the file browser
    root.mkdir()
    nbformat.write(notebook, root / "debugging.ipynb")
    server = Server(root)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture
def page(lab, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        tab = chromium_tab(p, tmp_path / "chromium-profile", 120_000, 1400, 1000)
        try:
            tab.goto(f"{lab.url}/{lab.notebooks}/debugging.ipynb?token={lab.token}")
            tab.wait_for_function(
                f"() => {NOTEBOOK}?.sessionContext?.session?.kernel?.connectionStatus === 'connected'")
            yield tab
        finally:
            tab.context.close()


def run_cell(page, index: int) -> None:
    page.evaluate(f"""(index) => {{
        {NOTEBOOK}.content.activeCellIndex = index;
        window.jupyterapp.commands.execute('notebook:run-cell');
    }}""", index)


def output_of(page, index: int) -> str:
    return page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-OutputArea").inner_text()


def click_gutter(page, cell: int, line: int) -> None:
    """Click the breakpoint gutter beside line ``line`` (from 1) of cell ``cell``'s editor."""
    editor = page.locator(".jp-Notebook .jp-Cell").nth(cell).locator(".cm-editor")
    gutter = editor.locator(".cm-breakpoint-gutter").first.bounding_box()
    row = editor.locator(".cm-line").nth(line - 1).bounding_box()
    page.mouse.click(gutter["x"] + gutter["width"] / 2, row["y"] + row["height"] / 2)


def test_a_breakpoint_clicked_in_a_cell_stops_on_worker1_with_its_locals(page):
    run_cell(page, 0)
    page.wait_for_function(
        "() => document.querySelectorAll('.jp-Notebook .jp-Cell')[0].innerText.includes('up in')",
        timeout=240_000)
    page.locator(".jp-DebuggerBugButton").first.click()  # the notebook's debugger on
    page.wait_for_function("() => document.querySelector('.jp-DebuggerBugButton')"
                           "?.outerHTML.includes('Disable Debugger')")
    page.evaluate("() => window.jupyterapp.commands.execute('debugger:show-panel')")
    click_gutter(page, 1, 2)
    page.locator(".jp-DebuggerBreakpoint").first.wait_for(state="visible")
    run_cell(page, 1)
    run_cell(page, 2)
    frame = page.locator(".jp-DebuggerCallstackFrame-name").first
    frame.wait_for(state="visible", timeout=180_000)
    assert frame.inner_text().strip() == "f"
    x = page.locator(".jp-DebuggerVariables-name", has_text="x").first
    x.wait_for(state="visible")
    row = x.locator("xpath=..")
    assert row.locator(".jp-DebuggerVariables-detail").inner_text().strip() == "3", row.inner_text()
    picture(page, "debugger.png")
    page.evaluate("() => { window.jupyterapp.commands.execute('debugger:continue'); }")
    page.wait_for_function("() => document.querySelectorAll('.jp-Notebook .jp-Cell')[2]"
                           ".querySelector('.jp-OutputArea')?.innerText.includes('8')")
    assert output_of(page, 2).strip().endswith("8")
    page.locator(".jp-DebuggerBugButton").first.click()  # the debugger off

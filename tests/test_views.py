"""The drawings as a class sees them on a projector: JupyterLab 4 at 1280x800 in Debian's
chromium (Playwright), in the Light and Dark themes.

One notebook shows an RRef graph over six workers, an autograd graph as wide as
tutorial 05's and an RPC timeline, all from saved snapshots (no cluster). In each theme
the test measures, in the page: every label's contrast against what it sits on
(composited through the translucent lane and box fills, as the browser paints them), at
least 4.5:1; that each drawing fits its output's width, that the fit / 1:1 button
switches to the drawing's own size (scrolling) and back, also in a narrow side-by-side
view; and that hover cards near the right and bottom edges show whole (nothing clips or
covers them), across inside their output. Screenshots go to build/browser/.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import nbformat
import pytest
from test_browser import ARTIFACTS, TESTS, Server, chromium_tab, report, why_no_browser

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CELLS = [
    f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
    "from _snapshots import TRACE, autograd_wide, synthetic\n"
    "from nbrpc.widgets import AutogradGraph, RRefGraph, Timeline",
    "RRefGraph(snapshot=synthetic(60, 6))",
    "AutogradGraph(autograd_wide())",
    "Timeline(TRACE)",
    "from nbrpc.drawing.status_table import StatusTable\n"
    "ROWS = [dict(name='master', rank=0, host='h', pid=1, state='driver', devices='-', busy=0, owned_rrefs=2),\n"
    "        dict(name='worker1', rank=1, host='h', pid=2, state='running', devices='-', busy=1, owned_rrefs=5)]\n"
    "StatusTable(ROWS)  # what %rpc_status shows",
    "from nbrpc.widgets.status import ClusterStatus\n\n"
    "class Saved:  # a cluster's status rows, kept\n"
    "    def status(self):\n        return ROWS\n\n"
    "ClusterStatus(live=False, cluster=Saved())",
]
KINDS = ["rref", "autograd", "timeline"]
THEMES = ["JupyterLab Light", "JupyterLab Dark"]

# In the page: each visible label of a drawing, its colour composited over what lies
# under its centre (the drawing's filled shapes, then the first opaque background up
# the page), and the WCAG contrast ratio of the two.
CONTRAST = """(root) => {
  const parse = (text) => {
    const m = /rgba?\\(([^)]*)\\)/.exec(text || "");
    if (!m) return null;
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  };
  const over = (top, alpha, bottom) => [0, 1, 2].map((i) => top[i] * alpha + bottom[i] * (1 - alpha));
  const lum = (c) => {
    const [r, g, b] = c.map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  };
  const ratio = (a, b) => { const [x, y] = [lum(a), lum(b)].sort((p, q) => q - p); return (x + 0.05) / (y + 0.05); };
  let page = [255, 255, 255];
  for (let e = root; e; e = e.parentElement) {
    const c = parse(getComputedStyle(e).backgroundColor);
    if (c && c[3] > 0) { page = over(c, c[3], page); break; }
  }
  const alphaOf = (e, c) => {
    const s = getComputedStyle(e);
    return c[3] * Number(s.fillOpacity) * Number(s.opacity);
  };
  const out = [];
  for (const text of root.querySelectorAll("svg text")) {
    const r = text.getBoundingClientRect();
    if (!r.width || !r.height || getComputedStyle(text).display === "none") continue;
    const x = r.left + r.width / 2, y = r.top + r.height / 2;
    if (x < 0 || y < 0 || x >= innerWidth || y >= innerHeight) continue;
    const svg = text.ownerSVGElement;
    const under = [];
    for (const shape of svg.querySelectorAll("rect, circle")) {
      if (shape.closest("text") || getComputedStyle(shape).display === "none") continue;
      const b = shape.getBoundingClientRect();
      if (b.left <= x && x <= b.right && b.top <= y && y <= b.bottom) under.push(shape);
    }
    let ground = page;
    for (const shape of under) {  // document order: the later paints over the earlier
      const c = parse(getComputedStyle(shape).fill);
      if (c) ground = over(c, alphaOf(shape, c), ground);
    }
    const f = parse(getComputedStyle(text).fill);
    const ink = over(f, alphaOf(text, f), ground);
    out.push({ text: text.textContent, ratio: ratio(ink, ground), ink, ground });
  }
  return out;
}"""


@pytest.fixture(scope="module")
def playwright():
    """One Playwright for the module: its sync API runs an event loop on this thread for
    as long as it is open, and a second one opened meanwhile refuses to start."""
    reason = why_no_browser("lab")
    if reason:
        report(f"SKIPPED: {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        yield p


@contextlib.contextmanager
def lab_notebook(playwright, notebook: Path, tmp_path_factory, timeout: int):
    """``notebook`` open in JupyterLab at 1280x800 with its kernel connected and every
    cell sent to run; the server and the browser end with the block."""
    server = Server(notebook.parent, "lab")
    try:
        server.wait_ready()
        tab = chromium_tab(playwright, tmp_path_factory.mktemp("chromium-profile"), timeout)
        try:
            tab.goto(f"{server.url}/{server.notebooks}/{notebook.name}?token={server.token}")
            tab.wait_for_function(
                "() => window.jupyterapp?.shell.currentWidget?.sessionContext?.session?.kernel"
                "?.connectionStatus === 'connected'")
            tab.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            yield tab
        finally:
            tab.context.close()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def views_page(tmp_path_factory, playwright):
    root = tmp_path_factory.mktemp("views")
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(c) for c in CELLS],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(notebook, root / "views.ipynb")
    with lab_notebook(playwright, root / "views.ipynb", tmp_path_factory, timeout=120_000) as tab:
        tab.wait_for_selector(".nbrpc-timeline-view .nbrpc-host svg", timeout=180_000)
        tab.wait_for_function("() => document.querySelectorAll('.nbrpc-host > svg').length === 3")
        tab.wait_for_selector(".nbrpc-status-table table.nbrpc-status")
        yield tab


def use_theme(page, theme: str) -> None:
    page.evaluate("(theme) => window.jupyterapp.commands.execute('apputils:change-theme', {theme})", theme)
    page.wait_for_function("(theme) => document.body.dataset.jpThemeName === theme", arg=theme)
    page.wait_for_timeout(500)  # the theme's stylesheet applies


def host(page, kind: str):
    index = KINDS.index(kind)
    return page.locator(".nbrpc-host").nth(index)


# A drawing's size in its host, and its smallest text as drawn (px): the text's own size
# scaled as the drawing is.
SIZES = """(h) => {
    const svg = h.querySelector(':scope > svg');
    const output = h.closest('.jp-OutputArea-output') || h.parentElement;
    const drawn = svg.getBoundingClientRect().width, own = Number(svg.getAttribute('width'));
    const texts = [...svg.querySelectorAll('text')].map((t) => parseFloat(getComputedStyle(t).fontSize));
    return {drawn, own, host: h.clientWidth, output: output.getBoundingClientRect().width,
            scrolls: h.scrollWidth > h.clientWidth + 1,
            smallest: texts.length ? Math.min(...texts) * drawn / own : null};
}"""


def sizes(page, kind: str) -> dict:
    return host(page, kind).evaluate(SIZES)


def assert_fits_down_to_readable_text(s: dict, label) -> None:
    """Fitted, a drawing takes its host's width, but never below 9/10 of its own (its 10 px
    text then draws at 9 px): a wider drawing keeps that and its host scrolls."""
    assert abs(s["drawn"] - max(min(s["own"], s["host"]), 0.9 * s["own"])) <= 1, (label, s)
    assert s["scrolls"] == (s["drawn"] > s["host"] + 1), (label, s)
    assert s["smallest"] is None or s["smallest"] >= 9 - 0.05, (label, s)


@pytest.mark.parametrize("theme", [*THEMES, "JupyterLab Dark High Contrast"])
def test_labels_read_at_4_5_to_1_in_both_themes(views_page, theme):
    page = views_page
    use_theme(page, theme)
    worst = []
    for kind in KINDS:
        host(page, kind).scroll_into_view_if_needed()
        page.wait_for_timeout(200)
        found = host(page, kind).evaluate(CONTRAST)
        assert len(found) >= 5, (kind, found)
        low = [f for f in found if f["ratio"] < 4.5]
        assert not low, f"{theme}, {kind}: labels under 4.5:1: {low[:5]}"
        worst.append(f"{kind} {min(f['ratio'] for f in found):.2f}")
        page.screenshot(path=str(ARTIFACTS / f"views_{kind}_{theme.split()[-1].lower()}.png"))
    # the widgets' own words (toolbar, status) and a hover card read too
    report(f"{theme}: lowest label contrast per drawing: {', '.join(worst)}")
    dark = page.evaluate("() => document.body.dataset.jpThemeLight") == "false"
    ground = page.evaluate("""() => getComputedStyle(document.querySelector('.nbrpc-host > svg text.nbrpc-ink'))
                              .fill""")
    assert ("255, 255, 255" in ground) == dark, ground  # light ink on dark, dark ink on light


@pytest.mark.parametrize("width", [1280, 720])
def test_drawings_fit_the_output_and_toggle_to_1_to_1(views_page, width):
    page = views_page
    page.set_viewport_size({"width": width, "height": 800})
    page.wait_for_timeout(500)
    try:
        for kind in KINDS:
            s = sizes(page, kind)
            assert_fits_down_to_readable_text(s, kind)
            assert s["host"] <= s["output"] + 1, (kind, s)
        # the wide ones are wider than the output at 1:1: the toggle shows them so, scrolling
        for kind in ("autograd", "timeline"):
            before = sizes(page, kind)
            if before["own"] <= before["host"]:
                continue
            button = page.locator(".nbrpc-fit-toggle").nth(KINDS.index(kind))
            assert button.inner_text() == "1:1"
            button.click()
            page.wait_for_function("(b) => b.textContent === 'fit'", arg=button.element_handle())
            s = sizes(page, kind)
            assert abs(s["drawn"] - s["own"]) < 1 and s["scrolls"], (kind, s)
            button.click()
            page.wait_for_function("(b) => b.textContent === '1:1'", arg=button.element_handle())
            assert_fits_down_to_readable_text(sizes(page, kind), kind)
        autograd = sizes(page, "autograd")
        report(f"{width} px window: autograd graph {autograd['own']:.0f} px drawn in {autograd['drawn']:.0f} px")
        page.screenshot(path=str(ARTIFACTS / f"views_fit_{width}.png"), full_page=True)
    finally:
        page.set_viewport_size({"width": 1280, "height": 800})


def hover_card(page, kind: str, item: str) -> dict:
    """Hover ``item`` (a selector inside the drawing) and return the card's, the view's and
    the output's boxes."""
    target = host(page, kind).locator(item)
    target.scroll_into_view_if_needed()
    box = target.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    view = host(page, kind).locator("xpath=..")
    tip = view.locator(":scope > .nbrpc-tip")
    tip.wait_for(state="visible")
    return view.evaluate("""(v) => {
        const r = (e) => {
            const b = e.getBoundingClientRect();
            return {l: b.left, t: b.top, r: b.right, b: b.bottom};
        };
        const output = v.closest('.jp-OutputArea-output');
        const tip = v.querySelector(':scope > .nbrpc-tip');
        const style = getComputedStyle(tip);
        // Whole: at its corners and centre the card is what the page shows on top.
        tip.style.pointerEvents = 'auto';
        const b = tip.getBoundingClientRect();
        const points = [[b.left + 2, b.top + 2], [b.right - 2, b.top + 2], [b.left + 2, b.bottom - 2],
                        [b.right - 2, b.bottom - 2], [(b.left + b.right) / 2, (b.top + b.bottom) / 2]];
        const hidden = points.filter(([x, y]) => !tip.contains(document.elementFromPoint(x, y)));
        tip.style.pointerEvents = '';
        return {tip: r(tip), view: r(v), output: r(output), win: {r: innerWidth, b: innerHeight},
                color: style.color, background: style.backgroundColor, hidden};
    }""")


@pytest.mark.parametrize("theme", THEMES)
def test_hover_cards_show_whole(views_page, theme):
    page = views_page
    use_theme(page, theme)
    cases = [
        ("rref", "svg circle.nbrpc-node >> nth=-1"),  # the rightmost lane's last RRef
        ("autograd", "svg g.nbrpc-node >> nth=-1"),  # the right lane's bottom right box
        ("timeline", "svg rect.nbrpc-tl-bar >> nth=-1"),  # the last call, near the right
    ]
    for kind, item in cases:
        found = hover_card(page, kind, item)
        tip, view, output, win = found["tip"], found["view"], found["output"], found["win"]
        assert tip["r"] - tip["l"] > 50 and tip["b"] - tip["t"] > 30, found
        assert found["hidden"] == [], (kind, found)  # nothing covers or clips any of it
        # across, inside the view and its output; down, inside the window
        assert tip["l"] >= max(view["l"], output["l"]) - 0.5, (kind, found)
        assert tip["r"] <= min(view["r"], output["r"]) + 0.5, (kind, found)
        assert tip["t"] >= 0 and tip["b"] <= win["b"], (kind, found)
        assert found["color"] != found["background"]
        page.screenshot(path=str(ARTIFACTS / f"views_tip_{kind}_{theme.split()[-1].lower()}.png"))
        page.mouse.move(0, 0)


def test_cluster_status_looks_like_rpc_status(views_page):
    """``ClusterStatus()`` draws its table as ``%rpc_status``'s output is drawn: same
    padding, font and rules, so columns never touch."""
    page = views_page
    use_theme(page, "JupyterLab Light")
    styles = page.evaluate("""() => {
        const widget = document.querySelector('.nbrpc-status-table table.nbrpc-status');
        const magic = [...document.querySelectorAll('table.nbrpc-status')].find(t => t !== widget);
        const look = (table) => {
            const td = getComputedStyle(table.querySelector('tbody td'));
            const tr = getComputedStyle(table.querySelector('tbody tr:nth-child(2)'));
            return {padding: [td.paddingLeft, td.paddingRight, td.paddingTop], font: td.fontSize,
                    border: getComputedStyle(table.querySelector('thead')).borderBottomWidth,
                    stripe: tr.backgroundColor};
        };
        const cells = [...widget.querySelectorAll('tbody tr:first-child td')].map(td => td.getBoundingClientRect());
        const gaps = cells.slice(1).map((b, i) => b.left - cells[i].right);
        return {widget: look(widget), magic: look(magic), gaps,
                text: [...widget.querySelectorAll('tbody td')].map(td => td.textContent)};
    }""")
    assert styles["widget"] == styles["magic"], styles
    assert "worker1" in styles["text"] and "running" in styles["text"]
    padding = sum(float(p.removesuffix("px")) for p in styles["widget"]["padding"][:2])
    assert padding >= 8, styles  # the columns have room between them
    page.locator(".nbrpc-status-table").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "views_cluster_status.png"))


# -- the tutorials' own views ----------------------------------------------------------


@pytest.fixture(scope="module", params=["01_parameter_server", "05_distributed_rnn"])
def tutorial_page(request, tmp_path_factory, playwright):
    """A tutorial run top to bottom in JupyterLab at 1280x800 (its cluster ends in its
    last cell; its views stay, with their hover details)."""
    root = tmp_path_factory.mktemp(request.param)
    notebook = nbformat.read(TESTS.parent / "tutorials" / f"{request.param}.ipynb", as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(notebook, root / "tutorial.ipynb")
    with lab_notebook(playwright, root / "tutorial.ipynb", tmp_path_factory, timeout=300_000) as tab:
        tab.wait_for_function("""() => {
            const cells = document.querySelectorAll('.jp-CodeCell');
            const last = cells[cells.length - 1];
            return last && /shut down/.test(last.querySelector('.jp-OutputArea')?.textContent || '');
        }""")
        errors = tab.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
        assert "Traceback" not in " ".join(errors.all_inner_texts())
        yield request.param, tab


@pytest.mark.parametrize("theme", THEMES)
def test_a_tutorials_views_read_fit_and_show_their_cards(tutorial_page, theme):
    name, page = tutorial_page
    use_theme(page, theme)
    hosts = page.locator(".nbrpc-host")
    count = hosts.count()
    assert count >= 2, f"{name}: {count} views"
    lowest = []
    for i in range(count):
        h = hosts.nth(i)
        h.scroll_into_view_if_needed()
        page.wait_for_timeout(200)
        found = h.evaluate(CONTRAST)
        low = [f for f in found if f["ratio"] < 4.5]
        assert not low, f"{name}, {theme}, view {i}: labels under 4.5:1: {low[:5]}"
        if found:
            lowest.append(min(f["ratio"] for f in found))
        assert_fits_down_to_readable_text(h.evaluate(SIZES), (name, i))
        item = h.locator("svg [data-id]").last
        if item.count():
            item.scroll_into_view_if_needed()
            box = item.bounding_box()
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            tip = h.locator("xpath=..").locator(":scope > .nbrpc-tip")
            tip.wait_for(state="visible")
            hidden = tip.evaluate("""(tip) => {
                tip.style.pointerEvents = 'auto';
                const b = tip.getBoundingClientRect();
                const points = [[b.left + 2, b.top + 2], [b.right - 2, b.top + 2], [b.left + 2, b.bottom - 2],
                                [b.right - 2, b.bottom - 2]];
                const out = points.filter(([x, y]) => !tip.contains(document.elementFromPoint(x, y)));
                tip.style.pointerEvents = '';
                return out;
            }""")
            assert hidden == [], (name, theme, i, hidden)
            page.screenshot(path=str(ARTIFACTS / f"tutorial_{name[:2]}_view{i}_{theme.split()[-1].lower()}.png"))
            page.mouse.move(0, 0)
    report(f"{name}, {theme}: {count} views; lowest label contrast {min(lowest):.2f}")


def test_a_view_docked_beside_the_notebook_fits_its_tab(views_page):
    """JupyterLab's "Create New View for Cell Output" puts a live view in a tab of its own,
    beside the notebook; the drawing fits that tab's width too."""
    page = views_page
    use_theme(page, "JupyterLab Light")
    page.evaluate("""() => {
        const app = window.jupyterapp;
        const notebook = app.shell.currentWidget.content;
        notebook.activeCellIndex = 3;  // Timeline(TRACE)
        return app.commands.execute('notebook:create-output-view');
    }""")
    docked = page.locator(".jp-LinkedOutputView .nbrpc-host > svg")
    docked.wait_for(state="visible")
    fits = docked.evaluate("""(svg) => {
        const host = svg.parentElement;
        const panel = svg.closest('.jp-LinkedOutputView').getBoundingClientRect();
        return {drawn: svg.getBoundingClientRect().width, host: host.clientWidth, panel: panel.width,
                own: Number(svg.getAttribute('width'))};
    }""")
    assert fits["drawn"] <= fits["host"] + 1 and fits["drawn"] <= fits["panel"], fits
    assert fits["panel"] < fits["own"], fits  # a narrow tab: the drawing was shrunk to fit it
    page.screenshot(path=str(ARTIFACTS / "views_docked.png"))

"""The wait-for graph: ``nbrpc.WaitsGraph`` and ``%rpc_waits --graph``.

The drawing is tested from hand-made waits snapshots (a cycle, a pool exhausted, a
dead member, a lock held across a call back into the same member): the SVG is parsed
as XML and its lanes, arrows, links and findings read back. Then a real cluster: the
live widget's SVG shows a pending call, in red, while a cell waits on it, and nothing
pending once the cell is over.
"""

from __future__ import annotations

import re
import threading
import xml.etree.ElementTree as ET

import pytest
from conftest import as_main, run, wait_gone, wait_until
from IPython.core.error import UsageError

import nbrpc
from nbrpc.drawing import svg, waits_layout, waits_svg
from nbrpc.widgets.waits_graph import WaitsGraph, waits_static

NS = "{http://www.w3.org/2000/svg}"


def member(name, threads=4, busy=0, state="running"):
    return {"name": name, "threads": threads, "busy": busy, "state": state}


def call(cid, caller, callee, function, state, waits_on=(), since=1.0, **extra):
    return {"id": cid, "caller": caller, "callee": callee, "function": function,
            "site": "cell 4, line 2", "thread": 7, "since": since, "state": state,
            "waits_on": list(waits_on), **extra}


CYCLE = {
    "members": [member("master"), member("worker1", busy=1), member("worker2", busy=1)],
    "calls": [call("m:1", "master", "worker1", "ping", "waiting", ["w1:1"]),
              call("w1:1", "worker1", "worker2", "pong", "waiting", ["w2:1"], since=2.0),
              call("w2:1", "worker2", "worker1", "ping_back", "queued", since=3.0)],
    "findings": [{"kind": "cycle", "members": ["master", "worker1", "worker2"],
                  "calls": ["m:1", "w1:1", "w2:1"],
                  "message": "master waits on ping on worker1 (cell 4, line 2): the calls wait on "
                             "each other in a cycle back to worker1. Make the waiting function "
                             "@rpc.functions.async_execution"}]}

POOL = {
    "members": [member("master"), member("worker1", threads=2, busy=2)],
    "calls": [call("m:1", "master", "worker1", "slow", "running"),
              call("m:2", "master", "worker1", "slow", "running", since=1.1),
              call("m:3", "master", "worker1", "add", "queued", since=1.2),
              call("m:4", "master", "worker1", "fine", "running", since=0.5)],
    "findings": [{"kind": "pool_exhausted", "members": ["worker1"], "calls": ["m:1", "m:2", "m:3"],
                  "message": "all 2 RPC threads of worker1 are busy (running slow) and 1 call to "
                             "worker1 (add) waits behind them. Start with more threads "
                             "(%rpc_init --threads 4)"}]}

DEAD = {
    "members": [member("master"), member("worker1"), member("worker2", state="gone", threads=None)],
    "calls": [call("m:1", "master", "worker2", "train", "waiting")],
    "findings": [{"kind": "dead_member", "members": ["master", "worker2"], "calls": ["m:1"],
                  "message": "master waits on train on worker2 (cell 4, line 2), but worker2 is gone "
                             "(exited with code -9): it answers nothing. Interrupt the cell"}]}

LOCK = {
    "members": [member("master"), member("worker1", busy=2)],
    "calls": [call("m:1", "master", "worker1", "outer", "waiting", ["w1:1"]),
              # its member's clock is behind: since alone would put it first
              call("w1:1", "worker1", "worker1", "inner", "running", since=0.5,
                   blocked_at={"what": "lock", "code": "with lock:", "cell": "cell 3, line 3",
                               "file": "/x/ipykernel_1/123.py", "line": 3})],
    "findings": [{"kind": "blocked", "members": ["master", "worker1"], "calls": ["m:1", "w1:1"],
                  "message": "worker1 runs outer (cell 3, line 6), which waits on its call to inner "
                             "on worker1, blocked at `with lock:` (cell 3, line 3)"}]}

EMPTY = {"members": [member("master"), member("worker1")], "calls": [], "findings": []}


def parse(drawing: str) -> ET.Element:
    root = ET.fromstring(drawing)
    assert root.tag == f"{NS}svg" and root.get("data-kind") == "waits"
    return root


def lanes(root) -> dict[str, ET.Element]:
    return {g.get("data-lane"): g for g in root.iter(f"{NS}g") if g.get("class") == "nbrpc-lane"}


def calls(root) -> dict[str, ET.Element]:
    return {g.get("data-id"): g for g in root.iter(f"{NS}g") if "nbrpc-call" in (g.get("class") or "")}


def texts(element) -> list[str]:
    return ["".join(t.itertext()) for t in element.iter(f"{NS}text")]


def line_ends(arrow) -> tuple[float, float]:
    d = arrow.find(f"{NS}path").get("d")
    numbers = [float(n) for n in re.findall(r"-?\d+(?:\.\d+)?", d)]
    return numbers[0], numbers[-2]


def findings(root) -> dict[str, str]:
    return {t.get("data-kind"): " ".join("".join(s.itertext()) for s in t)
            for t in root.iter(f"{NS}text") if "nbrpc-finding" in (t.get("class") or "")}


# -- the drawing, from hand-made snapshots ------------------------------------------------


def test_a_cycle_draws_a_lane_per_member_an_arrow_per_call_all_red():
    root = parse(waits_svg.waits_svg(CYCLE))
    assert list(lanes(root)) == ["master", "worker1", "worker2"]
    arrows = calls(root)
    assert list(arrows) == ["m:1", "w1:1", "w2:1"]
    places = waits_layout.waits_layout(CYCLE)
    centers = {name: lane.center for name, lane in places.lanes.items()}
    for c in CYCLE["calls"]:
        arrow = arrows[c["id"]]
        assert arrow.get("data-alarm") == "true"
        assert arrow.find(f"{NS}path").get("stroke") == waits_svg.ALARM
        start, end = line_ends(arrow)
        assert start == centers[c["caller"]]
        # the head sits at the callee's lane, just short of its middle
        assert abs(end - centers[c["callee"]]) <= 6
        assert texts(arrow)[0] == f"{c['function']} \u00b7 {c['state']}"
        assert set(arrow.get("data-workers").split()) == {c["caller"], c["callee"]}
    # a queued call is dashed; the others are not
    assert arrows["w2:1"].find(f"{NS}path").get("stroke-dasharray") == "5 3"
    assert arrows["m:1"].find(f"{NS}path").get("stroke-dasharray") is None
    # arrows go down the page, oldest first
    ys = [float(a.find(f"{NS}text").get("y")) for a in arrows.values()]
    assert ys == sorted(ys) and len(set(ys)) == 3
    # a served call is linked to the call its thread waits on
    links = [(p.get("data-from"), p.get("data-to")) for p in root.iter(f"{NS}path")
             if "nbrpc-waits-on" in (p.get("class") or "")]
    assert links == [("m:1", "w1:1"), ("w1:1", "w2:1")]
    found = findings(root)
    assert list(found) == ["cycle"]
    assert found["cycle"].startswith("cycle: master waits on ping on worker1")
    assert "@rpc.functions.async_execution" in found["cycle"]


def test_pool_exhausted_marks_the_member_busy_and_only_the_calls_it_names():
    root = parse(waits_svg.waits_svg(POOL))
    assert texts(lanes(root)["worker1"])[1] == "2/2 threads busy"
    # members keep their colours, but none is red: red says stuck
    assert all(g.find(f"{NS}rect").get("fill") != waits_svg.ALARM and
               g.find(f"{NS}rect").get("fill") not in ("#e15759", "#ff9da7")
               for g in lanes(parse(waits_svg.waits_svg(CYCLE))).values())
    assert texts(lanes(root)["master"])[1] == "0/4 threads busy"
    arrows = calls(root)
    assert [a.get("data-alarm") for a in arrows.values()] == ["true", "true", "true", "false"]
    assert arrows["m:4"].find(f"{NS}path").get("stroke") == waits_svg.MUTED
    assert arrows["m:3"].get("data-state") == "queued"
    found = findings(root)
    assert list(found) == ["pool_exhausted"]
    assert "all 2 RPC threads of worker1 are busy" in found["pool_exhausted"]
    red = [t for t in root.iter(f"{NS}text") if "nbrpc-finding" in (t.get("class") or "")]
    assert red[0].get("fill") == waits_svg.ALARM and "nbrpc-alarm" in red[0].get("class")


def test_a_dead_member_has_a_red_lane_that_says_so():
    root = parse(waits_svg.waits_svg(DEAD))
    lane = lanes(root)["worker2"]
    assert lane.get("data-state") == "gone"
    assert texts(lane) == ["worker2", "gone"]
    outline = lane.find(f"{NS}rect")
    assert outline.get("stroke") == waits_svg.ALARM and outline.get("class") == "nbrpc-alarm"
    assert lanes(root)["worker1"].find(f"{NS}rect").get("stroke") != waits_svg.ALARM
    assert calls(root)["m:1"].get("data-alarm") == "true"
    assert "worker2 is gone" in findings(root)["dead_member"]


def test_a_call_back_into_its_own_member_loops_and_says_where_it_is_blocked():
    root = parse(waits_svg.waits_svg(LOCK))
    inner = calls(root)["w1:1"]
    d = inner.find(f"{NS}path").get("d")
    assert " C" in d  # a loop, not a line across
    assert texts(inner) == ["inner \u00b7 running", "blocked on a lock"]
    assert texts(calls(root)["m:1"]) == ["outer \u00b7 waiting", "from cell 4, line 2"]
    # a chain reads downwards: the call that waits above the call it waits on
    assert list(calls(root)) == ["m:1", "w1:1"]
    assert [a.call["id"] for a in waits_layout.waits_layout(LOCK).arrows] == ["m:1", "w1:1"]
    details = waits_svg.waits_details(LOCK)
    assert dict(details["w1:1"]["rows"])["blocked"] == "on a lock at `with lock:` (cell 3, line 3)"
    assert details["m:1"]["title"] == "outer on worker1"
    # the static drawing carries the details as native tooltips
    assert "blocked: on a lock" in "".join(t.text or "" for t in inner.iter(f"{NS}title"))


def test_nothing_pending_and_a_member_only_a_call_names():
    root = parse(waits_svg.waits_svg(EMPTY))
    assert list(lanes(root)) == ["master", "worker1"] and not calls(root)
    assert "no call is pending" in texts(root)
    assert waits_svg.waits_summary(EMPTY) == "no call is pending"
    odd = {"members": [member("master")], "calls": [call("m:1", "master", "worker9", "f", "waiting")],
           "findings": []}
    root = parse(waits_svg.waits_svg(odd))
    assert lanes(root)["worker9"].get("data-state") == "gone"
    assert calls(root)["m:1"].get("data-alarm") == "false"


def test_the_drawing_is_deterministic_themed_and_escaped():
    assert waits_svg.waits_svg(CYCLE) == waits_svg.waits_svg(CYCLE)
    nasty = {**LOCK, "calls": [dict(LOCK["calls"][0], function="<b>&x")] + LOCK["calls"][1:]}
    root = parse(waits_svg.waits_svg(nasty))
    assert texts(calls(root)["m:1"])[0] == "<b>&x \u00b7 waiting"
    drawing = waits_svg.waits_svg(CYCLE)
    for role in ("nbrpc-ink", "nbrpc-muted", "nbrpc-line", "nbrpc-alarm"):
        assert f'class="{role}' in drawing or f" {role}\"" in drawing
        assert f".{role}" in svg.THEME_CSS
    assert "var(--jp-error-color1" in svg.THEME_CSS
    html = waits_svg.static_html(CYCLE)
    assert drawing in html and svg.THEME_CSS in html
    assert waits_svg.waits_summary(CYCLE) == "3 pending calls; stuck: cycle"


def contrast(a: str, b: str) -> float:
    """WCAG contrast ratio of two ``#rrggbb`` colours."""
    def luminance(c: str) -> float:
        r, g, b = (v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4
                   for v in (int(c[i:i + 2], 16) / 255 for i in (1, 3, 5)))
        return 0.2126 * r + 0.7152 * g + 0.0722 * b
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def tint(colour: str, opacity: float) -> str:
    return "#" + "".join(f"{round(int(colour[i:i + 2], 16) * opacity + 255 * (1 - opacity)):02x}"
                         for i in (1, 3, 5))


def test_every_label_has_a_theme_role_and_a_readable_fallback():
    for snapshot in (CYCLE, POOL, DEAD, LOCK, EMPTY):
        for text in parse(waits_svg.waits_svg(snapshot)).iter(f"{NS}text"):
            roles = set((text.get("class") or "").split())
            assert roles & {"nbrpc-ink", "nbrpc-muted", "nbrpc-alarm"}, text.attrib
            grounds = ["#ffffff"] + [tint(c, o) for c in waits_svg.LANE_COLOURS for o in (0.05, 0.2)]
            assert min(contrast(text.get("fill"), g) for g in grounds) >= 4.5, text.attrib


# -- the widget and its static fallback ----------------------------------------------------


def without_titles(drawing: str) -> str:
    return re.sub(r"<title>.*?</title>", "", drawing, flags=re.S)


def test_widget_and_static_fallback_draw_the_same_svg(tmp_path):
    graph = WaitsGraph(snapshot=POOL)
    try:
        assert graph.kind == "waits" and not graph.live
        data, _ = graph._repr_mimebundle_()
        assert set(data) == {"text/plain", "text/html", "application/vnd.jupyter.widget-view+json"}
        assert data["text/plain"] == "4 pending calls; stuck: pool_exhausted" == graph.status
        static = waits_svg.waits_svg(POOL)
        assert static in data["text/html"]
        assert graph.to_svg() == static
        # the widget leaves the native tooltips to its hover cards: otherwise the same SVG
        assert graph.svg == without_titles(static)
        assert set(graph.details) == {c["id"] for c in POOL["calls"]}
        assert graph.save(tmp_path / "w.svg").read_text().startswith('<?xml version="1.0"')
        assert ".nbrpc-alarm" in graph._css
    finally:
        graph.close()
    view = waits_static(DEAD)
    bundle = view._repr_mimebundle_()
    assert bundle["text/plain"] == "1 pending call; stuck: dead_member"
    assert waits_svg.waits_svg(DEAD) in bundle["text/html"]


def test_no_cluster_is_a_clear_error(ip):
    assert nbrpc.current() is None
    with pytest.raises(nbrpc.NoClusterError, match="%rpc_init"):
        nbrpc.WaitsGraph()
    with pytest.raises(nbrpc.NoClusterError, match="%rpc_init"):
        ip.run_line_magic("rpc_waits", "--graph")


def test_magic_flags_that_do_not_go_together(ip):
    with pytest.raises(UsageError, match="--static and --interval go with --graph"):
        ip.run_line_magic("rpc_waits", "--static")
    with pytest.raises(UsageError, match="--show and --graph"):
        ip.run_line_magic("rpc_waits", "--graph --show always")
    with pytest.raises(UsageError, match="--interval must be a positive number"):
        ip.run_line_magic("rpc_waits", "--graph --interval 0")


# -- a real cluster ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    c = nbrpc.start(1, progress=None, timeout=30, threads=4)
    pids = [w.pid for w in c.workers]
    yield c
    c.shutdown()
    assert not wait_gone(pids), "shutdown left worker processes running"


def test_live_graph_shows_a_pending_call_while_a_cell_waits(ip, cluster):
    with as_main(ip):
        run(ip, "import threading\nimport torch.distributed.rpc as rpc\n"
                "lock = threading.Lock()\n"
                "def inner():\n"
                "    with lock:\n"
                "        return 1\n"
                "def outer():\n"
                "    with lock:\n"
                "        return rpc.rpc_sync('worker1', inner, timeout=8)\n")
        graph = ip.run_line_magic("rpc_waits", "--graph --interval 0.5")
        errors: list[BaseException] = []

        def cell():
            try:
                run(ip, "rpc.rpc_sync('worker1', outer, timeout=6)")
            except BaseException as e:  # the timeout, asserted on below
                errors.append(e)

        waiting = threading.Thread(target=cell, daemon=True)
        try:
            assert isinstance(graph, WaitsGraph) and graph.live
            assert graph.status.startswith("live, every 0.5 s")
            waiting.start()

            def shows_the_hang():
                root = parse(graph.svg)
                arrows = {"".join(a.find(f"{NS}text").itertext()): a for a in calls(root).values()}
                outer = arrows.get("outer \u00b7 waiting")
                if outer is not None and outer.get("data-alarm") == "true" and "blocked" in findings(root):
                    return [root]
                return None

            shown = wait_until(shows_the_hang, 10, interval=0.2)
            assert shown, graph.svg
            root = shown[0]
            assert list(lanes(root)) == [cluster.driver_name, "worker1"]
            outer = next(a for a in calls(root).values() if texts(a)[0] == "outer \u00b7 waiting")
            assert outer.get("data-workers") == f"{cluster.driver_name} worker1"
            assert "worker1 runs outer (cell " in findings(root)["blocked"]
            assert "stuck: blocked" in graph.status
            waiting.join(60)
            assert not waiting.is_alive()
            assert errors and isinstance(errors[0], nbrpc.RpcTimeoutError)
            assert wait_until(lambda: "no call is pending" in graph.svg, 20, interval=0.5), graph.svg
            # the static fallback draws what the cluster shows now
            assert "no call is pending" in ip.run_line_magic("rpc_waits", "--graph --static").svg
        finally:
            waiting.join(60)
            graph.close()
    assert not graph.live

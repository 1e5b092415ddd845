"""The RPC timeline from hand-made trace snapshots: layout, numbers, SVG, report, widget.

``_snapshots.TRACE`` is a two-stage pipeline in ``schemas.TraceSnapshot``'s shape; the
recorded runs (a real cluster, a real browser) are in test_browser.py and the tutorials.
"""

from __future__ import annotations

import copy
import json
import random
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import cloudpickle
import pytest
from _snapshots import TRACE, trace_synthetic

import nbrpc
from nbrpc.drawing import summary
from nbrpc.drawing import timeline_layout as tl
from nbrpc.drawing import timeline_svg as ts

SVG = "{http://www.w3.org/2000/svg}"

# spin, below, goes to the workers by value, like notebook code.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def classed(root: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in root.iter() if cls in (e.get("class") or "").split()]


def bars(root: ET.Element) -> dict[str, ET.Element]:
    return {e.get("data-id"): e for e in classed(root, "nbrpc-tl-bar")}


# -- layout ---------------------------------------------------------------------------


def test_one_lane_per_member_in_rank_order_then_unlisted_ones():
    place = tl.timeline_layout(TRACE)
    assert list(place.lanes) == ["master", "w1", "w2"]
    snap = copy.deepcopy(TRACE)
    snap["calls"].append(dict(snap["calls"][0], id="gone:1", caller="gone", callee="w1"))
    assert list(tl.timeline_layout(snap).lanes) == ["master", "w1", "w2", "gone"]
    lanes = list(place.lanes.values())
    for upper, lower in zip(lanes, lanes[1:]):
        assert upper.y + upper.height == lower.y  # stacked, no gaps, no overlap


def test_a_bar_per_call_where_and_when_it_ran():
    place = tl.timeline_layout(TRACE)
    by_id = {b.id: b for b in place.bars}
    ran = [c for c in TRACE["calls"] if c["began"] is not None]
    assert sorted(by_id) == sorted(c["id"] for c in ran)  # "lost" has no callee part: no bar
    assert place.t0 == 100.0 and place.t1 == 100.25
    scale = place.plot_w / 0.25
    for c in ran:
        bar = by_id[c["id"]]
        lane = place.lanes[c["callee"]]
        assert bar.lane == c["callee"]
        assert bar.x == pytest.approx((c["began"] - 100.0) * scale)
        assert bar.width == pytest.approx((c["ended"] - c["began"]) * scale)
        assert lane.y < bar.y and bar.y + tl.ROW_H < lane.y + lane.height
        assert bar.fill == tl.colour(c["name"])
    assert by_id["master:5"].failed and not by_id["master:1"].failed


def test_overlapping_calls_in_a_lane_stack_in_rows():
    place = tl.timeline_layout(TRACE)
    by_id = {b.id: b for b in place.bars}
    # w2's fetch from w1 runs while w1 runs stage1: a second row in w1's lane
    assert place.lanes["w1"].rows == 2 and place.lanes["w2"].rows == 1
    assert by_id["w2:1"].y > by_id["master:1"].y
    assert by_id["master:1"].y == by_id["master:2"].y  # back to back: one row
    assert tl.pack_rows([("a", 0, 2), ("b", 1, 3), ("c", 2, 4), ("d", 3, 5)]) == {
        "a": 0, "b": 1, "c": 0, "d": 1}
    many = tl.pack_rows([(str(k), 0, 1) for k in range(10)])
    assert max(many.values()) == tl.MAX_ROWS - 1


def test_lines_go_from_the_caller_to_the_bar_and_back():
    place = tl.timeline_layout(TRACE)
    lines = {(s.id, s.kind): s for s in place.segments}
    send, reply = lines[("master:3", "send")], lines[("master:3", "reply")]
    master, w2 = place.lanes["master"], place.lanes["w2"]
    assert send.x1 == pytest.approx(place.x(100.06)) and send.y1 == master.wait_y
    assert send.x2 == pytest.approx(place.x(100.07)) and w2.y < send.y2 < w2.y + w2.height
    assert reply.x1 == pytest.approx(place.x(100.11)) and reply.x2 == pytest.approx(place.x(100.12))
    assert reply.y2 == master.wait_y
    # a nested call starts from its caller's lane (w2, running master:3) ...
    assert lines[("w2:1", "send")].y1 == place.lanes["w2"].wait_y
    # ... a call with no reply waits until the end, and has no lines to a bar
    wait = lines[("master:6", "wait")]
    assert wait.x2 == pytest.approx(place.plot_w)
    assert ("master:6", "send") not in lines


def test_thread_lanes():
    place = tl.timeline_layout(TRACE, threads=True)
    assert list(place.lanes) == ["master", "w1/t1", "w1/t2", "w1/t3", "w2/t1", "w2/t2"]
    assert place.lanes["w1/t3"].label == "w1 \u00b7 t3"
    by_id = {b.id: b for b in place.bars}
    assert by_id["master:2"].lane == "w1/t2" and by_id["w2:1"].lane == "w1/t3"
    # the nested call leaves from the thread that ran its parent
    send = next(s for s in place.segments if s.id == "w2:1" and s.kind == "send")
    assert send.y1 == place.lanes["w2/t1"].wait_y


def test_window_keeps_the_last_seconds():
    last = tl.window(TRACE, 0.1)
    assert last["start"] == pytest.approx(100.15)
    # master:4 (sent 100.10, replied 100.16) straddles the start: kept, cut at the start;
    # master:3 (replied 100.12) is over before it; master:6 is in flight (no reply).
    assert [c["id"] for c in last["calls"]] == ["master:4", "master:5", "master:6"]
    place = tl.timeline_layout(last)
    assert place.t0 == pytest.approx(100.15)
    wait = next(s for s in place.segments if s.id == "master:4" and s.kind == "wait")
    assert wait.x1 < 0 < wait.x2  # master waited from before the window into it: clipped at 0
    flying = next(s for s in place.segments if s.id == "master:6" and s.kind == "wait")
    assert flying.x2 == pytest.approx(place.plot_w)  # in flight: drawn to the window's end
    assert tl.window(TRACE, None) is TRACE
    assert tl.window(TRACE, 10)["start"] == 100.0
    with pytest.raises(ValueError, match="positive number of seconds"):
        tl.window(TRACE, 0)


def test_above_the_threshold_lanes_show_busy_shares():
    snap = trace_synthetic(3000, 4)
    place = tl.timeline_layout(snap)
    assert place.aggregated and place.calls == 3000
    assert all(b.id.startswith("busy:") and b.fill == tl.BUSY for b in place.bars)
    assert not place.segments
    assert sum(b.count for b in place.bars) == 3000
    # each worker runs 0.7 ms of every 4 ms: 17.5% busy, drawn as a share in 5% steps
    shares = {round(b.share, 2) for b in place.bars if 0.1 * place.plot_w < b.x < 0.9 * place.plot_w}
    assert shares <= {0.15, 0.2}, shares
    full = tl.AGG_ROWS * tl.ROW_H + (tl.AGG_ROWS - 1) * tl.ROW_GAP
    for b in place.bars:
        assert b.height == pytest.approx(full * b.share)
    assert len(place.bars) <= 4 * place.plot_w / tl.AGG_BIN
    assert not tl.timeline_layout(snap, aggregate_above=None).aggregated
    drawing = ts.timeline_svg(snap)
    assert "aggregated: 3,000 calls" in drawing
    assert len(drawing) < 100_000


# -- numbers ------------------------------------------------------------------------


def test_call_stats_per_function_and_callee():
    rows = {(r["name"], r["callee"]): r for r in summary.summarize(TRACE)}
    stage1 = rows[("stage1", "w1")]
    assert stage1["count"] == 2
    # a call's time is from sent to reply: 60 and 90 ms
    assert stage1["total"] == pytest.approx(0.15) and stage1["median"] == pytest.approx(0.075)
    assert stage1["queue"] == pytest.approx(0.025)  # queued 10 and 40 ms
    assert stage1["bytes"] == 2 * (4096 + 100 + 4096 + 50)
    assert rows[("boom", "w1")]["errors"] == 1
    lost = rows[("lost", "w2")]
    assert lost["median"] is None and lost["queue"] is None and lost["total"] == 0
    assert [r["name"] for r in summary.summarize(TRACE)][-1] == "lost"
    text = ts.summary_text(TRACE)
    assert text.splitlines()[0] == ("RPC timeline: 7 calls on 3 members over 250.0 ms; "
                                    "busy: w1 90.0 ms, w2 80.0 ms")
    # the two overlap (100.00-100.06, 100.01-100.10): under way for 100 ms of wall time,
    # 150 ms summed; the table says which is which
    assert stage1["wall"] == pytest.approx(0.1)
    assert text.splitlines()[1].split() == list(ts.STAT_COLUMNS)
    assert "stage1    w1          2  100.0 ms  150.0 ms  75.0 ms  25.0 ms  16.3 KiB       0" in text


def flat(intervals) -> list[float]:
    return [t for pair in intervals for t in pair]


def test_busy_intervals_and_overlap():
    w1, w2 = tl.busy_intervals(TRACE, "w1"), tl.busy_intervals(TRACE, "w2")
    assert flat(w1) == pytest.approx([100.01, 100.09, 100.18, 100.19])
    assert flat(w2) == pytest.approx([100.07, 100.15])
    assert tl.busy_time(w1) == pytest.approx(0.09)
    assert tl.overlap(w1, w2) == pytest.approx(0.02)
    assert flat(tl.busy_intervals(TRACE, "w1", names={"stage1"})) == pytest.approx([100.01, 100.09])
    assert tl.overlap([(0, 1), (2, 3)], [(0.5, 2.5)]) == pytest.approx(1.0)
    assert tl.merge([(0, 1), (1.05, 2)], gap=0.1) == [(0, 2)]


def test_clock_bound_is_said_when_not_zero():
    assert "clocks" not in ts.headline(TRACE)
    snap = copy.deepcopy(TRACE)
    snap["clocks"][2]["bound"] = 0.0004
    snap["dropped"] = 3
    line = ts.headline(snap)
    assert "clocks aligned within \u00b1400 \u00b5s (w2)" in line and "3 records dropped" in line
    assert "\u00b1400 \u00b5s" in ts.timeline_svg(snap)


def test_ticks_and_labels():
    marks = tl.ticks(0, 0.25)
    assert [label for _, label in marks] == ["0 ms", "50 ms", "100 ms", "150 ms", "200 ms", "250 ms"]
    assert [t for t, _ in marks] == pytest.approx([0, 0.05, 0.1, 0.15, 0.2, 0.25])
    assert [label for _, label in tl.ticks(1, 3)][:3] == ["1.0 s", "1.5 s", "2.0 s"]
    assert [label for _, label in tl.ticks(0, 0.0004)][:2] == ["0 \u00b5s", "50 \u00b5s"]
    assert tl.tick_label(0.0015, 0.0005) == "1.5 ms"


def test_colours_are_fixed_per_function_name():
    assert tl.colour("stage1") != tl.colour("stage2")
    assert tl.colour("stage1").startswith("#") and len(tl.colour("stage1")) == 7
    code = "from nbrpc.drawing.timeline_layout import colour; print(colour('Shard.forward'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == tl.colour("Shard.forward")  # not Python's salted hash
    assert len({tl.colour(f"f{k}") for k in range(40)}) > 10


# -- the SVG ------------------------------------------------------------------------


def test_svg_is_xml_with_a_bar_per_call_and_the_details():
    drawing = ts.timeline_svg(TRACE)
    root = ET.fromstring(drawing)
    assert root.tag == f"{SVG}svg" and root.get("data-kind") == "timeline"
    shown = bars(root)
    assert sorted(shown) == sorted(c["id"] for c in TRACE["calls"] if c["began"] is not None)
    assert shown["master:1"].get("data-workers") == "master w1"
    tooltip = shown["master:3"].find(f"{SVG}title").text
    assert "queueing delay: 10.0 ms" in tooltip and "master \u2192 w2" in tooltip
    assert "error: ValueError: no" in shown["master:5"].find(f"{SVG}title").text
    assert [e.get("data-lane") for e in classed(root, "nbrpc-lane")] == ["master", "w1", "w2"]
    assert [t.text for t in classed(root, "nbrpc-tl-tick")][-1] == "250 ms"
    plot = classed(root, "nbrpc-tl-plot")[0]
    assert plot.get("viewBox") == f"0 0 {tl.PLOT_W} {plot.get('height')}"
    assert {e.get("data-call") for e in classed(root, "nbrpc-tl-send")[0]} == {
        "master:1", "master:2", "master:3", "master:4", "master:5", "w2:1"}


def test_svg_is_deterministic():
    drawing = ts.timeline_svg(TRACE)
    shuffled = copy.deepcopy(TRACE)
    random.Random(1).shuffle(shuffled["calls"])
    assert ts.timeline_svg(shuffled) == drawing
    assert ts.timeline_svg(json.loads(json.dumps(TRACE))) == drawing
    assert " id=" not in drawing  # nothing that two drawings on a page could share


def test_details_of_a_call():
    details = ts.call_details(TRACE)
    rows = dict(details["master:3"]["rows"])
    assert details["master:3"]["title"] == "stage2 on w2"
    assert rows["queueing delay"] == "10.0 ms" and rows["ran for"] == "40.0 ms"
    assert rows["sent"] == "+60.0 ms" and rows["round trip"] == "60.0 ms"
    assert rows["request"] == "100 B (0 B tensors, 100 B pickle)"
    assert dict(details["w2:1"]["rows"])["inside call"] == "master:3"
    assert dict(details["master:6"]["rows"])["note"] == "the callee's part was not recorded"


# -- the report and the widget ----------------------------------------------------------


def test_write_report_is_one_page_with_nothing_to_fetch(tmp_path):
    path = tmp_path / "trace.html"
    code = (f"import sys, json\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            f"from _snapshots import TRACE\nfrom nbrpc.drawing.report import write_report\n"
            f"write_report(TRACE, {str(path)!r})\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('IPython', 'ipywidgets', 'anywidget'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []  # a plain script writes it
    page = path.read_text()
    assert page.startswith("<!DOCTYPE html>")
    assert "src=" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert "function render(" in page and "export default" not in page
    state = page.split('id="nbrpc-timeline-state">')[1].split("</script>")[0]
    assert json.loads(state.replace("<\\/", "</"))["details"]["master:3"]["title"] == "stage2 on w2"
    assert "<table" in page and "stage1" in page


def test_timeline_widget_from_a_snapshot():
    widget = nbrpc.Timeline(TRACE)
    try:
        assert type(widget).__module__ == "nbrpc.widgets.timeline" and "Timeline" in nbrpc.__all__
        assert len(bars(ET.fromstring(widget.svg))) == 6
        assert set(widget.details) == {c["id"] for c in TRACE["calls"]}
        assert "stage1" in widget.table and widget.selected == "" and not widget.live
        data, _ = widget._repr_mimebundle_()
        assert data["text/plain"].startswith("RPC timeline: 7 calls")
        assert "<svg" in data["text/html"] and "<title>" in data["text/html"]
        assert "application/vnd.jupyter.widget-view+json" in data
        assert "<title>" not in widget.svg  # the widget shows its own details
        last = nbrpc.Timeline(TRACE, last=0.1)
        assert set(last.details) == {"master:4", "master:5", "master:6"}  # master:4 straddles the start
        last.close()
        threads = nbrpc.Timeline(TRACE, threads=True)
        assert 'data-lane="w1/t3"' in threads.svg
        threads.close()
    finally:
        widget.close()


def test_timeline_save(tmp_path):
    widget = nbrpc.Timeline(TRACE)
    try:
        svg_path = widget.save(tmp_path / "t.svg")
        ET.fromstring(svg_path.read_text().split("\n", 1)[1])
        assert "function render(" in widget.save(tmp_path / "t.html").read_text()
    finally:
        widget.close()


def test_timeline_refuses_what_it_cannot_show():
    with pytest.raises(ValueError, match="cannot refresh"):
        nbrpc.Timeline(TRACE, live=True)
    with pytest.raises(TypeError, match="not int"):
        nbrpc.Timeline(42)
    with pytest.raises(ValueError, match="positive"):
        nbrpc.Timeline(TRACE, last=-1)
    assert nbrpc.current() is None, "no cluster runs yet (this module's traced cluster starts later)"
    with pytest.raises(nbrpc.NoClusterError, match="%rpc_init --trace"):
        nbrpc.Timeline()


def test_timeline_of_a_trace_object():
    class Recorded:  # what nbrpc.trace() gives: an object with snapshot()
        def __init__(self):
            self.calls = 0

        def snapshot(self):
            self.calls += 1
            return TRACE

    source = Recorded()
    widget = nbrpc.Timeline(source)
    try:
        widget.refresh()
        assert source.calls == 2 and len(widget.details) == 7
    finally:
        widget.close()


def test_rpc_timeline_magic_usage():
    from IPython.core.error import UsageError
    from IPython.testing import globalipapp

    globalipapp.start_ipython()
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "nbrpc")
    with pytest.raises(UsageError, match="--last must be a positive"):
        shell.run_line_magic("rpc_timeline", "--last 0")
    with pytest.raises(UsageError, match="unrecognized arguments"):
        shell.run_line_magic("rpc_timeline", "--bogus")
    assert nbrpc.current() is None, "no cluster runs yet (this module's traced cluster starts later)"
    with pytest.raises(nbrpc.NoClusterError, match="start one with %rpc_init"):
        shell.run_line_magic("rpc_timeline", "")


def test_time_waiting_on_own_calls_is_marked_and_left_out_of_work():
    place = tl.timeline_layout(TRACE)
    bar = {b.id: b for b in place.bars}["master:3"]  # w2 runs it, and fetches from w1 inside
    ((x, width),) = bar.waits
    assert x == pytest.approx(place.x(100.071)) and width == pytest.approx(0.004 * place.plot_w / 0.25)
    assert not {b.id: b for b in place.bars}["master:1"].waits
    assert len(classed(ET.fromstring(ts.timeline_svg(TRACE)), "nbrpc-tl-waiting")[0]) == 1
    assert dict(ts.call_details(TRACE)["master:3"]["rows"])["waited on its own calls"] == "4.0 ms"
    worked = tl.busy_intervals(TRACE, "w2", waits=False)
    assert flat(worked) == pytest.approx([100.07, 100.071, 100.075, 100.15])
    assert tl.busy_time(worked) == pytest.approx(0.08 - 0.004)


# -- on a real, traced cluster -------------------------------------------------------------


def spin(seconds: float) -> float:
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        pass
    return seconds



def test_timeline_of_the_running_clusters_recording(traced, tmp_path):
    import torch.distributed.rpc as rpc
    from IPython.testing import globalipapp

    [f.wait() for f in [rpc.rpc_async(w, spin, args=(0.05,)) for w in ("worker1", "worker2")]]
    widget = nbrpc.Timeline()
    try:
        spins = [c for c in widget.snapshot["calls"] if c["name"].endswith("spin")]
        assert sorted(c["callee"] for c in spins) == ["worker1", "worker2"]
        assert all(c["ended"] - c["began"] >= 0.05 for c in spins)
        assert {b.id for b in widget.place.bars} >= {c["id"] for c in spins}
        ET.fromstring(widget.svg)
        # live: a new call shows up by itself, and a shutdown would stop it
        widget.start(interval=0.2)
        assert widget.live and widget.follow
        rpc.rpc_sync("worker1", spin, args=(0.01,))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(
                [c for c in widget.snapshot["calls"] if c["name"].endswith("spin")]) < 3:
            time.sleep(0.1)
        assert len([c for c in widget.snapshot["calls"] if c["name"].endswith("spin")]) == 3
        assert widget.status.startswith("live, every 0.2 s")
        widget.stop()
        assert not widget.live and widget.status.startswith("stopped at")
    finally:
        widget.close()
    time.sleep(0.3)
    recent = nbrpc.Timeline(last=0.25)
    assert all(c["sent"] >= recent.snapshot["end"] - 0.25 for c in recent.snapshot["calls"])
    recent.close()

    globalipapp.start_ipython()
    shell = globalipapp.get_ipython()
    shell.run_line_magic("load_ext", "nbrpc")
    static = shell.run_line_magic("rpc_timeline", "--static --threads")
    assert "RPC timeline" in static._repr_mimebundle_()["text/plain"]
    assert 'data-lane="worker1/' in static.svg
    shown = shell.run_line_magic("rpc_timeline", "--last 60")
    assert isinstance(shown, nbrpc.Timeline) and not shown.live
    shown.close()


def test_a_traced_block_saved_as_a_report(traced, tmp_path):
    import torch.distributed.rpc as rpc

    with nbrpc.trace() as t:
        rpc.rpc_sync("worker2", spin, args=(0.01,))
    page = t.save(tmp_path / "block.html").read_text()
    assert "function render(" in page and "spin" in page
    widget = nbrpc.Timeline(t)
    try:
        assert [c["callee"] for c in widget.snapshot["calls"] if c["name"].endswith("spin")] == ["worker2"]
    finally:
        widget.close()


def test_legend_labels_are_unique_and_keep_the_method():
    names = ["BatchUpdateParameterServer.update_and_fetch_model",
             "BatchUpdateParameterServer.get_model", "train", "x" * 40, "x" * 40 + "y"]
    labels = ts.legend_labels(names)
    assert len(set(labels)) == len(labels) and all(len(a) <= ts.LEGEND_CHARS + 4 for a in labels)
    assert labels[0].endswith("update_and_fetch_model") and labels[1].endswith(".get_model")
    assert labels[2] == "train"
    snap = copy.deepcopy(TRACE)
    for c, name in zip(snap["calls"], names * 2):
        c["name"] = name
    legend = classed(ET.fromstring(ts.timeline_svg(snap)), "nbrpc-tl-legend")[0]
    shown = [t.text for t in legend.iter(SVG + "text")]
    assert len(shown) == len(set(shown)) >= 3


def test_a_call_still_running_is_drawn_to_the_windows_end():
    snap = copy.deepcopy(TRACE)
    running = next(c for c in snap["calls"] if c["id"] == "master:5")
    running["ended"] = running["replied"] = None
    place = tl.timeline_layout(snap)
    bar = {b.id: b for b in place.bars}["master:5"]
    assert bar.running and bar.x + bar.width == pytest.approx(place.plot_w)
    drawn = bars(ET.fromstring(ts.draw(snap, place)))["master:5"]
    assert "nbrpc-tl-running" in drawn.get("class").split() and drawn.get("stroke-dasharray")
    rows = dict(ts.call_details(snap)["master:5"]["rows"])
    assert rows["note"] == "still running when this was recorded" and rows["ran for"] == "-"

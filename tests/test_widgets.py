"""The widgets: layouts and SVG from fixed snapshots, then the widgets on a real cluster.

The fixtures follow the snapshot schemas of docs/guide/views.md; the browser test (test_browser.py)
checks what a person sees.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from _snapshots import AUTOGRAD, RREF, synthetic
from conftest import wait_until

import nbrpc
from nbrpc.drawing import describe, layout, svg
from nbrpc.widgets import AutogradGraph, RRefGraph

SVG_NS = "{http://www.w3.org/2000/svg}"

def parse(drawing: str) -> ET.Element:
    return ET.fromstring(drawing)


def items(root: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in root.iter() if cls in (e.get("class") or "").split()]


# -- layout --------------------------------------------------------------------------


def test_rref_layout_puts_each_rref_in_its_owners_lane():
    places = layout.rref_layout(RREF)
    assert list(places.lanes) == ["master", "p1", "p2"]
    assert [lane.index for lane in places.lanes.values()] == [0, 1, 2]
    for r in RREF["rrefs"]:
        x, y = places.positions[r["id"]]
        lane = places.lanes[r["owner"]]
        assert lane.x < x < lane.x + lane.width
        assert lane.header_bottom < y < lane.y + lane.height
    # id order within a lane, on a grid: 0:1 then 0:2 side by side
    (x1, y1), (x2, y2) = places.positions["0:1"], places.positions["0:2"]
    assert y1 == y2 and x2 - x1 == layout.CELL
    assert places.width >= places.lanes["p2"].x + places.lanes["p2"].width


def test_rref_layout_is_stable_when_rrefs_come_and_go():
    before = layout.rref_layout(RREF).positions
    grown = copy.deepcopy(RREF)
    grown["rrefs"].append(dict(RREF["rrefs"][0], id="0:11", owner="p2"))
    after = layout.rref_layout(grown).positions
    assert {k: after[k] for k in before} == before
    assert layout.rref_layout(copy.deepcopy(RREF)).positions == before


def test_rref_layout_wraps_rows_and_adds_lanes_for_unlisted_workers():
    snap = synthetic(rrefs=50, workers=3)
    snap["rrefs"][0]["holders"].append("gone")
    places = layout.rref_layout(snap)
    assert list(places.lanes) == ["master", "w1", "w2", "gone"]
    w1 = [places.positions[r["id"]] for r in snap["rrefs"] if r["owner"] == "w1"]
    assert len({x for x, _ in w1}) == layout.LANE_COLUMNS
    assert len({y for _, y in w1}) == -(-len(w1) // layout.LANE_COLUMNS)
    assert len({lane.height for lane in places.lanes.values()}) == 1


def test_rref_layout_aggregated_has_one_position_per_owner():
    places = layout.rref_layout(synthetic(), aggregate=True)
    assert sorted(places.positions) == [f"w{i}" for i in range(1, 8)]


def test_autograd_layers_follow_the_backward_pass():
    layers = layout.autograd_layers(AUTOGRAD)
    assert layers["master:0"] == 0
    for e in AUTOGRAD["edges"]:
        assert layers[e["dst"]] > layers[e["src"]], e
    assert layers["master:2"] == 6  # the leaf at the end of the longest path


def test_autograd_layers_survive_a_cycle():
    bad = copy.deepcopy(AUTOGRAD)
    bad["edges"].append({"src": "w1:1", "dst": "w1:0", "kind": "local"})
    layers = layout.autograd_layers(bad)
    assert set(layers) == {n["id"] for n in bad["nodes"]}
    assert layers["master:0"] == 0


def test_autograd_layout_keeps_functions_in_their_lanes_and_rows_apart():
    places = layout.autograd_layout(AUTOGRAD)
    assert list(places.lanes) == ["master", "w1"]
    for n in AUTOGRAD["nodes"]:
        x, y = places.positions[n["id"]]
        lane = places.lanes[n["worker"]]
        assert lane.x <= x - layout.FN_W / 2 and x + layout.FN_W / 2 <= lane.x + lane.width
    # the three children of AddmmBackward0 share a layer, side by side, not overlapping
    row = sorted(places.positions[i][0] for i in ("w1:2", "w1:3", "w1:4"))
    assert len({places.positions[i][1] for i in ("w1:2", "w1:3", "w1:4")}) == 1
    assert all(b - a >= layout.FN_W for a, b in zip(row, row[1:]))


# -- SVG -----------------------------------------------------------------------------


def test_rref_svg_is_deterministic_and_well_formed():
    drawing = svg.rref_svg(RREF)
    # the same picture in another process, whose string hashes are salted differently
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from _snapshots import RREF; "
            "from nbrpc.drawing import svg; sys.stdout.write(svg.rref_svg(RREF))")
    other = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)], capture_output=True,
                           text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert other.stdout == drawing
    shuffled = dict(RREF, rrefs=list(reversed(RREF["rrefs"])), events=list(reversed(RREF["events"])))
    assert svg.rref_svg(shuffled) == drawing
    root = parse(drawing)
    assert root.tag == SVG_NS + "svg"
    assert " id=" not in drawing  # no element ids: two copies on a page never clash
    assert "NaN" not in drawing and "-0 " not in drawing


def test_rref_svg_counts_nodes_edges_and_forks():
    root = parse(svg.rref_svg(RREF))
    nodes = items(root, "nbrpc-node")
    assert [n.get("data-id") for n in nodes] == ["0:1", "0:2", "0:10"]
    colours = {n.get("data-id"): n.get("fill") for n in nodes}
    assert colours["0:1"] == colours["0:2"] == svg.colour(1) != colours["0:10"] == svg.colour(2)
    holds = items(root, "nbrpc-hold")
    assert sorted((e.get("data-rref"), e.get("data-workers")) for e in holds) == [
        ("0:1", "p1 master"), ("0:10", "p2 master"), ("0:2", "p1 master"), ("0:2", "p1 p2")]
    forks = items(root, "nbrpc-fork")  # one arc per (sender, receiver): two forks master -> p2
    assert [f.get("data-workers") for f in forks] == ["master p2"]
    assert "2 forks master \u2192 p2" in ET.tostring(forks[0], encoding="unicode")
    assert items(parse(svg.rref_svg(RREF, show_forks=False)), "nbrpc-fork") == []
    lanes = [e.get("data-lane") for e in root.iter() if e.get("data-lane")]
    assert lanes == ["master", "p1", "p2"]
    unconfirmed = next(n for n in nodes if n.get("data-id") == "0:10")
    assert unconfirmed.get("stroke-dasharray")


def test_fork_counts_of_opposite_directions_do_not_overlap():
    snap = copy.deepcopy(RREF)
    snap["events"] += [{"t": 9.0 + k, "kind": "fork", "rref": "0:2", "from": "p2", "to": "master"}
                       for k in range(3)]
    forks = items(parse(svg.rref_svg(snap)), "nbrpc-fork")
    labels = {f.get("data-workers"): next(f.iter(SVG_NS + "text")) for f in forks}
    ahead, back = labels["master p2"], labels["p2 master"]
    assert (ahead.text, back.text) == ("2", "3")
    assert ahead.get("x") == back.get("x")  # the same midpoint...
    assert abs(float(ahead.get("y")) - float(back.get("y"))) >= 11  # ...one count above the other
    assert min(float(ahead.get("y")), float(back.get("y"))) >= 10  # inside the drawing


def test_room_for_fork_arcs_only_when_they_are_drawn():
    with_forks = parse(svg.rref_svg(RREF, show_forks=True))
    without = parse(svg.rref_svg(RREF, show_forks=False))
    assert float(with_forks.get("height")) - float(without.get("height")) == layout.FORK_BAND
    first_lane = next(e for e in without.iter() if e.get("data-lane") == "master")
    assert float(first_lane.find(SVG_NS + "rect").get("y")) == layout.MARGIN  # no empty band on top
    no_forks = dict(RREF, events=[e for e in RREF["events"] if e["kind"] != "fork"])
    assert parse(svg.rref_svg(no_forks, show_forks=True)).get("height") == without.get("height")


def test_forks_of_a_pinned_rref_are_grouped_by_pair():
    snap = copy.deepcopy(RREF)
    snap["events"] = [{"t": float(k), "kind": "fork", "rref": "0:2", "from": "master",
                       "to": f"w{k % 3}"} for k in range(300)]
    snap["events"] += [{"t": 400.0, "kind": "fork", "rref": "0:2", "from": "w0", "to": "w1"}]
    rows = dict(describe.rref_details(snap)["0:2"]["rows"])
    assert rows["forks"] == ("301 forks: master → w0 ×100; master → w1 ×100; "
                             "master → w2 ×100; w0 → w1")
    many = {"0:2": [{"from": "a", "to": f"w{k}"} for k in range(10)]}
    text = describe.fork_text(__import__("collections").Counter((e["from"], e["to"]) for e in many["0:2"]))
    assert text.endswith("; and 4 more pairs") and text.count("→") == describe.FORK_PAIRS


def test_function_boxes_are_as_wide_as_their_labels():
    snap = copy.deepcopy(AUTOGRAD)
    long = "model.encoder.layers.11.attention.weight"
    snap["nodes"][6]["param"] = long
    places = layout.autograd_layout(snap)
    assert places.box_w["master"] == layout.FN_W  # short labels: the narrowest box
    assert places.box_w["w1"] >= 12 + layout.CHAR_W * len(long)
    node = next(n for n in items(parse(svg.autograd_svg(snap)), "nbrpc-node") if n.get("data-id") == "w1:2")
    assert next(node.iter(SVG_NS + "text")).text == long  # whole, not clipped
    assert float(node.find(SVG_NS + "rect").get("width")) == pytest.approx(places.box_w["w1"], abs=0.1)


def test_drawings_name_theme_roles_and_fall_back_to_readable_colours():
    root = parse(svg.rref_svg(RREF))
    texts = [t for t in root.iter(SVG_NS + "text")]
    assert texts and all({"nbrpc-ink", "nbrpc-muted", "nbrpc-tick"} & set((t.get("class") or "").split())
                         for t in texts)
    # the fallbacks (GitHub, nbviewer: no theme variables) read at 4.5:1 on white and on
    # each lane's tinted header (its colour at 0.2 over white)
    for colour in svg.PALETTE:
        header = "#" + "".join(f"{round(int(colour[i:i + 2], 16) * 0.2 + 255 * 0.8):02x}" for i in (1, 3, 5))
        for ink in (svg.INK, svg.MUTED):
            assert svg.contrast(ink, "#ffffff") >= 4.5 and svg.contrast(ink, header) >= 4.5, (ink, header)
        assert svg.contrast(svg.text_on(colour), colour) >= 4.5  # counts on aggregated nodes
    assert "var(--jp-ui-font-color1" in svg.THEME_CSS and "var(--jp-layout-color0" in svg.THEME_CSS
    static = svg.static_html(svg.rref_svg(RREF), "summary")
    assert "nbrpc-fit" in static and "<style>" in static and "max-width:100%" in static


def test_rref_svg_titles_carry_the_details():
    root = parse(svg.rref_svg(RREF))
    (node,) = [n for n in items(root, "nbrpc-node") if n.get("data-id") == "0:1"]
    text = node.find(SVG_NS + "title").text
    for expected in ("RRef 0:1", "owner: p1", "Tensor[2, 3] float32", "size: 24 B", "holders: master",
                     'call site: cell line 2: ra = rpc.remote("p1", load_a)'):
        assert expected in text
    bare = items(parse(svg.rref_svg(RREF, titles=False)), "nbrpc-node")
    assert [n.find(SVG_NS + "title") for n in bare] == [None, None, None]


def test_rref_svg_worker_filter():
    root = parse(svg.rref_svg(RREF, worker="p2"))
    assert [n.get("data-id") for n in items(root, "nbrpc-node")] == ["0:2", "0:10"]


def test_rref_svg_aggregates_above_the_threshold():
    big = synthetic()
    full = parse(svg.rref_svg(big, aggregate_above=1000))
    assert len(items(full, "nbrpc-node")) == 1000
    assert len(items(full, "nbrpc-hold")) == sum(len(r["holders"]) for r in big["rrefs"])
    summed = svg.rref_svg(big, aggregate_above=999)
    nodes = items(parse(summed), "nbrpc-node")
    assert [n.get("data-id") for n in nodes] == [f"@w{i}" for i in range(1, 8)]
    counts = [int(t.text) for n in nodes for t in n.iter(SVG_NS + "text")]
    assert sum(counts) == 1000
    assert len(summed) < 30_000 < len(svg.rref_svg(big, aggregate_above=None))
    # one edge per (owner, holder) pair: every owner to master, and to its one neighbour
    assert len(items(parse(summed), "nbrpc-hold")) == 2 * 7


def test_autograd_svg_draws_rpc_edges_and_gradient_norms():
    drawing = svg.autograd_svg(AUTOGRAD)
    assert drawing == svg.autograd_svg(copy.deepcopy(AUTOGRAD))
    root = parse(drawing)
    assert len(items(root, "nbrpc-node")) == 9
    rpc_edges = items(root, "nbrpc-rpc")
    assert sorted((e.get("data-src"), e.get("data-dst")) for e in rpc_edges) == [
        ("master:1", "w1:0"), ("w1:4", "master:3")]
    assert all(e.find(SVG_NS + "path").get("stroke") == svg.RPC for e in rpc_edges)
    assert len(items(root, "nbrpc-local")) == 6
    grads = [t.text for t in items(root, "nbrpc-grad")]
    assert sorted(grads) == ["\u2016grad\u2016 0.21", "\u2016grad\u2016 0.53"]


def test_details_and_summaries():
    details = describe.rref_details(RREF)
    rows = dict(details["0:2"]["rows"])
    assert rows["holders"] == "master, p2" and rows["forks"] == "master \u2192 p2"
    assert rows["size"] == "80 B" and rows["call site"] == "-"
    assert dict(details["0:1"]["rows"])["fetches"] == "1"
    assert describe.size_text(3 * 1024 * 1024) == "3.0 MiB"
    assert describe.rref_summary(RREF) == (
        "RRef graph: 3 RRefs on 3 workers (owned: master 0, p1 2, p2 1); 2 forks, 6 events")
    assert "context 7: 9 functions on 2 workers (master 4, w1 5), 2 rpc edges" in \
        describe.autograd_summary(AUTOGRAD)
    assert dict(describe.autograd_details(AUTOGRAD)["w1:2"]["rows"])["grad norm"] == "0.53"


# -- widgets, no cluster -------------------------------------------------------------


def test_graph_mimebundle_has_a_static_fallback(tmp_path):
    graph = RRefGraph(snapshot=RREF)
    try:
        data, _ = graph._repr_mimebundle_()
        assert set(data) == {"text/plain", "text/html", "application/vnd.jupyter.widget-view+json"}
        assert data["text/plain"] == describe.rref_summary(RREF)
        assert svg.rref_svg(RREF, show_forks=False) in data["text/html"]
        assert not graph.live and graph.status == data["text/plain"]
        assert graph.save(tmp_path / "g.svg").read_text().startswith('<?xml version="1.0"')
        assert "<!DOCTYPE html>" in graph.save(tmp_path / "g.html").read_text()
        graph.show_forks = True
        assert graph.to_svg() == svg.rref_svg(RREF, show_forks=True)
    finally:
        graph.close()
    # closed: ipywidgets shows nothing for it any more; the drawing remains
    assert set(graph.static()._repr_mimebundle_()) == {"text/plain", "text/html"}


def test_large_graph_widget_is_full_but_its_static_view_aggregates():
    graph = RRefGraph(snapshot=synthetic())
    try:
        assert graph.svg.count('class="nbrpc-node"') == 1000
        assert graph.svg.count('class="nbrpc-bundle"') == 14
        assert len(graph.details) == 1000
        html = graph._repr_mimebundle_()[0]["text/html"]
        assert html.count('class="nbrpc-node"') == 7
    finally:
        graph.close()


def test_autograd_graph_from_a_snapshot():
    graph = AutogradGraph(AUTOGRAD)
    try:
        assert graph.kind == "autograd"
        assert graph.svg == svg.autograd_svg(AUTOGRAD, titles=False)
        assert graph.to_svg() == svg.autograd_svg(AUTOGRAD)
        assert set(graph.details) == {n["id"] for n in AUTOGRAD["nodes"]}
    finally:
        graph.close()


def test_widgets_need_a_cluster_when_not_given_a_snapshot():
    assert nbrpc.current() is None
    with pytest.raises(nbrpc.NoClusterError, match="%rpc_init"):
        nbrpc.RRefGraph()
    with pytest.raises(nbrpc.NoClusterError, match="%rpc_init"):
        nbrpc.ClusterStatus()


# -- widgets on a real cluster -------------------------------------------------------


def wait_for(check, timeout: float = 10.0, what: str = "condition"):
    assert wait_until(check, timeout), f"timed out waiting for {what}"


def test_live_graph_follows_rrefs_and_stops_with_the_cluster():
    cluster = nbrpc.start(names=["p1"], progress=None, timeout=30)
    status = graph = None
    try:
        graph = nbrpc.RRefGraph(interval=0.2)
        status = nbrpc.ClusterStatus(interval=0.2)
        assert graph.live and status.live
        assert graph.status.startswith("live, every 0.2 s")
        held = rpc.remote("p1", torch.ones, args=((2, 3),))
        held.to_here()
        wait_for(lambda: graph.svg.count('class="nbrpc-node"') == 1, what="the new RRef")
        (rid,) = graph.details
        rows = dict(graph.details[rid]["rows"])
        assert rows["owner"] == "p1" and rows["holders"] == "master"
        assert rows["summary"] == "Tensor[2, 3] float32" and rows["size"] == "24 B"
        assert "rpc.remote" in rows["call site"]
        wait_for(lambda: "<td>p1</td>" in status.html and ">1</td></tr>" in status.html,
                 what="the owned RRef in the status table")
        del held
        wait_for(lambda: 'class="nbrpc-node"' not in graph.svg, what="the RRef to go")
    finally:
        cluster.shutdown()
    wait_for(lambda: not graph.live and not status.live, what="refreshing to stop")
    assert graph.status.startswith("not live: ")
    assert "<td>stopped</td>" in status.html
    graph.close()
    status.close()


def test_autograd_graph_of_a_real_context(cluster):
    def scale(x):
        return x * 2

    with dist_autograd.context() as context_id:
        x = torch.ones(2, 3, requires_grad=True)
        loss = rpc.rpc_sync("worker1", scale, args=(x,)).sum()
        dist_autograd.backward(context_id, [loss])
        graph = AutogradGraph(context_id)
    try:
        root = parse(graph.to_svg())
        assert len(items(root, "nbrpc-rpc")) >= 1
        assert {"master", "worker1"} <= set(graph.snapshot["workers"])
    finally:
        graph.close()


def test_magics_draw_static_graphs(cluster):
    from IPython.testing import globalipapp

    globalipapp.start_ipython()
    ip = globalipapp.get_ipython()
    ip.run_line_magic("load_ext", "nbrpc")
    held = rpc.remote("worker2", torch.zeros, args=((4,),))
    held.to_here()
    view = ip.run_line_magic("rref_graph", "--static")
    data = view._repr_mimebundle_()
    assert set(data) == {"text/plain", "text/html"}
    assert 'data-id="' in data["text/html"] and "worker2 1" in data["text/plain"]
    graph = ip.run_line_magic("rref_graph", "--interval 0.5")
    try:
        assert graph.live and graph.interval == 0.5
    finally:
        graph.close()
    assert not graph.live
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="--interval"):
        ip.run_line_magic("rref_graph", "--interval 0")
    with pytest.raises(UsageError):
        ip.run_line_magic("autograd_graph", "not-a-number")
    with pytest.raises(nbrpc.AutogradContextError):
        ip.run_line_magic("autograd_graph", "123456")


def test_rref_svg_bundles_edges_above_the_threshold():
    big = synthetic()
    root = parse(svg.rref_svg(big, bundle_above=999))
    assert len(items(root, "nbrpc-node")) == 1000
    quiet = items(root, "nbrpc-quiet")
    assert len(quiet) == sum(len(r["holders"]) for r in big["rrefs"])
    assert {e.get("display") for e in quiet} == {"none"}
    bundles = items(root, "nbrpc-bundle")
    assert len(bundles) == 2 * 7  # every owner to master, and to its one neighbour
    assert sum(int(b.find(SVG_NS + "title").text.split()[0]) for b in bundles) == len(quiet)
    assert items(parse(svg.rref_svg(big, bundle_above=1000)), "nbrpc-bundle") == []

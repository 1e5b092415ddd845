"""Words for the graphs: hover details per item and the ``text/plain`` summaries.

Each item's details are ``{"title": str, "rows": [[label, value], ...]}`` with every
value already a string, so the front end shows them as they are and the static SVG's
``<title>`` tooltips say the same thing.
"""

from __future__ import annotations

import collections

from .layout import autograd_workers, natural_key, rref_order, rref_workers


def size_text(size: int | None) -> str:
    """``24 B``, ``1.5 KiB``, ``3.0 MiB``; ``-`` when unknown."""
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def norm_text(norm) -> str:
    return "-" if norm is None else f"{float(norm):.4g}"


def _text(value) -> str:
    return "-" if value is None or value == "" else str(value)


def rref_history(snapshot: dict) -> dict[str, list[dict]]:
    """Events per RRef id, oldest first."""
    history: dict[str, list[dict]] = collections.defaultdict(list)
    for event in sorted(snapshot.get("events", []), key=lambda e: e.get("t", 0)):
        history[event.get("rref")].append(event)
    return history


def fork_text(forks: collections.Counter) -> str:
    """Forks grouped by (sender, receiver), most first: ``ps → trainer1 ×120; ...``."""
    if not forks:
        return "-"
    pairs = sorted(forks.items(), key=lambda kv: (-kv[1], natural_key(str(kv[0][0])), natural_key(str(kv[0][1]))))
    shown = [f"{a} \u2192 {b}" + (f" \u00d7{n}" if n > 1 else "") for (a, b), n in pairs[:FORK_PAIRS]]
    more = len(pairs) - FORK_PAIRS
    total = sum(forks.values())
    head = f"{total} fork{'s' * (total != 1)}: " if total > 1 else ""
    return head + "; ".join(shown) + (f"; and {more} more pairs" if more > 0 else "")


FORK_PAIRS = 6  # (sender, receiver) pairs a details row names


def rref_details(snapshot: dict) -> dict[str, dict]:
    """Hover details of every RRef, by id."""
    history = rref_history(snapshot)
    details = {}
    for r in snapshot.get("rrefs", []):
        events = history.get(r["id"], [])
        forks = collections.Counter((e.get("from"), e.get("to")) for e in events if e.get("kind") == "fork")
        fetches = sum(1 for e in events if e.get("kind") == "fetch")
        rows = [
            ["id", r["id"]],
            ["owner", _text(r.get("owner"))],
            ["creator", _text(r.get("creator"))],
            ["type", _text(r.get("type"))],
            ["summary", _text(r.get("summary"))],
            ["size", size_text(r.get("size"))],
            ["holders", ", ".join(r.get("holders") or []) or "-"],
            ["call site", _text(r.get("call_site"))],
            ["confirmed", "yes" if r.get("confirmed") else "not yet"],
            ["forks", fork_text(forks)],
            ["fetches", str(fetches)],
        ]
        details[r["id"]] = {"title": f"RRef {r['id']}", "rows": rows}
    return details


def owner_details(snapshot: dict) -> dict[str, dict]:
    """Details of the per-owner nodes of an aggregated RRef view, by owner name."""
    details = {}
    for owner, owned in rref_order(snapshot).items():
        holders = collections.Counter(h for r in owned for h in r.get("holders") or [])
        sizes = [r["size"] for r in owned if r.get("size") is not None]
        types = collections.Counter(r.get("type") or "?" for r in owned)
        details[owner] = {"title": f"{len(owned)} RRefs owned by {owner}", "rows": [
            ["owner", owner],
            ["RRefs", str(len(owned))],
            ["bytes", size_text(sum(sizes)) if sizes else "-"],
            ["types", ", ".join(f"{t} {n}" for t, n in sorted(types.items()))],
            ["holders", ", ".join(f"{h} {holders[h]}" for h in sorted(holders, key=natural_key)) or "-"],
        ]}
    return details


def rref_summary(snapshot: dict) -> str:
    """One line for ``text/plain``: RRefs per owner, forks and events."""
    workers = rref_workers(snapshot)
    by_owner = rref_order(snapshot)
    rrefs = snapshot.get("rrefs", [])
    events = snapshot.get("events", [])
    forks = sum(1 for e in events if e.get("kind") == "fork")
    owners = ", ".join(f"{w} {len(by_owner.get(w, []))}" for w in workers)
    return (f"RRef graph: {len(rrefs)} RRef{'s' * (len(rrefs) != 1)} on {len(workers)} workers "
            f"(owned: {owners}); {forks} fork{'s' * (forks != 1)}, {len(events)} events")


def autograd_details(snapshot: dict) -> dict[str, dict]:
    """Hover details of every autograd function, by id."""
    grads = {(g.get("worker"), g.get("param")): g for g in snapshot.get("gradients", [])}
    parents: dict[str, list[str]] = collections.defaultdict(list)
    children: dict[str, list[str]] = collections.defaultdict(list)
    for e in snapshot.get("edges", []):
        parents[e["dst"]].append(f"{e['src']} ({e.get('kind', 'local')})")
        children[e["src"]].append(f"{e['dst']} ({e.get('kind', 'local')})")
    details = {}
    for n in snapshot.get("nodes", []):
        rows = [["id", n["id"]], ["worker", _text(n.get("worker"))], ["function", _text(n.get("name"))]]
        if n.get("param"):
            rows.append(["parameter", n["param"]])
            grad = grads.get((n.get("worker"), n["param"]))
            if grad is not None:
                shape = "[" + ", ".join(str(d) for d in grad.get("shape") or []) + "]"
                rows += [["grad shape", shape], ["grad norm", norm_text(grad.get("norm"))]]
        rows += [["from", ", ".join(parents.get(n["id"], [])) or "-"],
                 ["next", ", ".join(children.get(n["id"], [])) or "-"]]
        details[n["id"]] = {"title": f"{n.get('name')} on {n.get('worker')}", "rows": rows}
    return details


def autograd_summary(snapshot: dict) -> str:
    workers = autograd_workers(snapshot)
    nodes = snapshot.get("nodes", [])
    per = collections.Counter(n.get("worker") for n in nodes)
    rpc_edges = sum(1 for e in snapshot.get("edges", []) if e.get("kind") == "rpc")
    line = (f"Autograd graph of context {snapshot.get('context_id')}: {len(nodes)} functions on "
            f"{len(workers)} workers ({', '.join(f'{w} {per[w]}' for w in workers)}), "
            f"{rpc_edges} rpc edge{'s' * (rpc_edges != 1)}")
    grads = snapshot.get("gradients", [])
    if grads:
        line += "; gradient norms: " + ", ".join(
            f"{g.get('worker')}/{g.get('param')} {norm_text(g.get('norm'))}" for g in grads)
    return line

"""RRef snapshots: every member's ledger (``rref_ledger``), gathered and merged.

``rref_snapshot`` asks every member for its ``rref_ledger.report`` (in parallel, one
call each) and ``merge`` combines them into an ``RRefSnapshot``: each RRef alive in
the group with its owner, creator and holders, and the recent events.
"""

from __future__ import annotations

from ..calls.fanout import ask_members
from ..recording.rref_ledger import EVENTS_KEPT, report
from ..schemas import RRefSnapshot

__all__ = ["merge", "rref_snapshot"]


def gather(timeout: float = 5.0) -> list[dict]:
    """Every member's ``report``, asked in parallel; unreachable members are left out."""
    return sorted(ask_members(report, (timeout,), timeout), key=lambda r: r["id"])


def rref_snapshot(timeout: float = 5.0) -> RRefSnapshot:
    """Every RRef alive in the group: owner, creator, holders, value summary, and events
    (``nbrpc.schemas.RRefSnapshot``)."""
    reports = gather(timeout)
    if not any(r["tracking"] for r in reports):
        raise RuntimeError(
            "RRef tracking is off in this cluster (it was started with track=False); "
            "start it with tracking on (the default) to take RRef snapshots"
        )
    return merge(reports)


def merge(reports: list[dict]) -> RRefSnapshot:
    """Combine members' ledgers into one snapshot (pure: unit-testable)."""
    names = {r["id"]: r["name"] for r in reports}

    def name(worker_id: int) -> str:
        return names.get(worker_id, f"#{worker_id}")

    rrefs: dict[str, dict] = {}
    for r in reports:
        for row in r["held"]:
            entry = rrefs.setdefault(row["id"], dict(
                id=row["id"], owner=name(row["owner"]),
                creator=name(int(row["id"].split(":")[0])), holders=[], type=None,
                summary=None, size=None, call_site=None, confirmed=False))
            entry["holders"].append(r["name"])
            for key in ("type", "summary", "size", "call_site"):
                if entry[key] is None:
                    entry[key] = row[key]
            entry["confirmed"] = entry["confirmed"] or row["confirmed"]
    events = sorted(e for r in reports for e in r["events"])[-EVENTS_KEPT:]
    return dict(
        workers=[dict(name=r["name"], id=r["id"], host=r["host"], pid=r["pid"]) for r in reports],
        rrefs=sorted(rrefs.values(), key=_id_order),
        events=[{"t": round(t, 6), "kind": kind, "rref": rid, "from": name(a), "to": name(b)}
                for t, kind, rid, a, b in events],
    )


def _id_order(entry: dict) -> tuple[int, int]:
    created_on, local_id = entry["id"].split(":")
    return int(created_on), int(local_id)

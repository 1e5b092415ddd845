"""The differential check: the same calls under raw torch, in three plain processes that
``init_rpc`` and import the functions, and in a real nbrpc cluster, from the notebook's
``__main__``; what each side sees must be the same (``tests/differential/``).

Generated messages (Hypothesis, a fixed seed; ``NBRPC_DIFFERENTIAL_EXAMPLES`` sets how
many, ``make conformance`` runs more), errors and timeouts of every call form, and torch's
documented examples. A failure prints the smallest message Hypothesis found, what differs,
and both sides' facts.
"""

from __future__ import annotations

import os

import pytest
from conftest import free_port, run
from differential.compare import report
from differential.notebook import Notebook
from differential.raw import RawTorch
from differential.scenarios import CASES, EXAMPLES
from differential.strategies import KINDS, scenarios
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.slow  # two groups start (about 20 s on 2 idle cores); the module takes about a minute

# Generated messages in all, shared among the kinds of callables and the two size ranges.
EXAMPLE_COUNT = int(os.environ.get("NBRPC_DIFFERENTIAL_EXAMPLES", "84"))
ERROR_FORMS = ("rpc_sync", "rpc_async", "remote")
TIMEOUT_FORMS = (*ERROR_FORMS, "then")


@pytest.fixture(scope="module")
def raw():
    """master, worker1, worker2 under raw torch, started once for the module."""
    group = RawTorch(free_port())
    yield group
    assert not group.close(), "the raw torch processes did not end"


@pytest.fixture(scope="module")
def notebook(shell, cluster):
    return Notebook(shell, cluster, run)


def agree(raw, notebook, request: dict, timed: bool = False) -> None:
    difference = report(request, raw.ask(request), notebook.ask(request), timed)
    assert difference is None, difference


def two_views(n: int, first: list, second: list, write: int = 0, kind: str = "function") -> dict:
    """A message of two views of one float32 base of ``n`` elements; the callee writes the
    ``write``-th and sends both back."""
    return {"kind": kind, "form": "rpc_sync", "to": "worker1", "next": "worker2", "write": write,
            "bases": [{"dtype": "float32", "n": n, "seed": 0, "grad": False}],
            "leaves": [{"base": 0, "view": first}, {"base": 0, "view": second}],
            "items": [["leaf", 0], ["leaf", 1]]}


BIG = 1 << 20  # float32 elements: 4 MiB, past the shared-memory path's threshold


@settings(max_examples=max(1, EXAMPLE_COUNT // (2 * len(KINDS))), derandomize=True, database=None, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
@pytest.mark.parametrize("sizes", ["any", "big"])
@pytest.mark.parametrize("kind", KINDS)
def test_generated_messages_arrive_as_under_raw_torch(raw, notebook, kind, sizes, data):
    """``sizes="big"``: every base past the shared-memory threshold, which Hypothesis
    draws seldom among small sizes."""
    spec = data.draw(scenarios(kind, big_only=sizes == "big"), label="spec")
    agree(raw, notebook, {"scenario": spec})


# Messages that differed once (regression tests).
FOUND = {
    # issue 55, item 1: a 4 MiB tensor and a view of most of it (torch keeps them one storage)
    "big-view-written": two_views(BIG, ["whole"], ["slice", 0, 600 * 1024, 1]),
    "big-view-async": two_views(BIG, ["slice", 0, 600 * 1024, 1], ["whole"], write=1, kind="async"),
    # a small view of a big storage, which torch sends as a copy of its own
    "small-view-of-big": two_views(BIG, ["whole"], ["slice", 10, 1000, 1], write=1),
    # found by the check (before issue 55's fix): one view of most of a 2 MiB storage, which
    # torch sends with its whole storage, arrived with only the view's bytes
    "one-view-of-most": {**two_views(1048581, ["slice", 0, 786436, 1], ["slice", 0, 786436, 1], kind="method"),
                         "bases": [{"dtype": "bfloat16", "n": 1048581, "seed": 0, "grad": False}],
                         "items": [["leaf", 0]]},
    # found by the check: a TorchScript function's error (an in-place write to a leaf that
    # requires grad) seen through a then callback carried nbrpc's frames (issue 55, item 5)
    "script-error-through-then": {**two_views(524287, ["whole"], ["whole"], kind="script"), "form": "then",
                                  "bases": [{"dtype": "bfloat16", "n": 524287, "seed": 0, "grad": True}],
                                  "items": [], "profiled": True},
}


@pytest.mark.parametrize("name", sorted(FOUND))
def test_found_message_arrives_as_under_raw_torch(raw, notebook, name):
    agree(raw, notebook, {"scenario": FOUND[name]})


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_documented_example_gives_raw_torchs_result(raw, notebook, name):
    agree(raw, notebook, {"example": name})


@pytest.mark.parametrize("form", ERROR_FORMS)
@pytest.mark.parametrize("case", ["raises", "unpicklable_reply", "unpicklable_argument", "unknown_worker"])
def test_error_has_raw_torchs_class_and_words(raw, notebook, case, form):
    agree(raw, notebook, {"case": case, "options": {"form": form}})


@pytest.mark.parametrize("form", TIMEOUT_FORMS)
@pytest.mark.parametrize("case", ["timeout", "default_timeout"])
def test_timeout_fires_at_its_time(raw, notebook, case, form):
    agree(raw, notebook, {"case": case, "options": {"form": form}}, timed=True)


def test_every_case_is_checked():
    assert set(CASES) == {"raises", "unpicklable_reply", "unpicklable_argument", "unknown_worker",
                          "timeout", "default_timeout"}

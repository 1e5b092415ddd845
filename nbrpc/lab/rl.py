"""Lab 5's checks: an agent and its observers, actions chosen in batches.

``_Agent`` is the checks' own agent, with the lab's attributes (``states``, ``pending``,
``lock``, ``future``) and a rule instead of a policy: action 1 when a state's sum is
positive; it counts its batches. ``_Observer`` plays a made-up game of fixed states, one
reward per step, and asks the agent with a short timeout so that a batch that never
completes shows as an error rather than a hang. ``_select_action`` is the right answer,
for the check of the round.
"""

from __future__ import annotations

import threading

import torch
import torch.distributed.rpc as rpc

from .._compat import torch_compat
from ._checking import _call, _Checks, _show, _Wrong

# This lab's checkers by exercise name, in the order of its notebook.
CHECKS = _Checks()

# Seconds an observer of the checks waits for an action before it gives up.
_PATIENCE = 3.0
_TIMED_OUT = r"[Tt]imeout|timed out|got no answer within"
_ONE_BY_ONE = ("a batch waits for every observer, so an observer asked alone never gets its "
               "action: start run_episode on every observer with rpc_async first, then wait "
               "for all the futures")
_OBSERVERS = ("observer1", "observer2")


class _Agent:
    """The checks' agent: a fixed rule instead of a policy."""

    def __init__(self, n_observers):
        self.states = torch.zeros(n_observers, 4)
        self.pending, self.lock = n_observers, threading.Lock()
        self.future = torch.futures.Future()
        self.batches = 0

    def act(self, states):
        self.batches += 1
        return (states.sum(dim=1) > 0).long()


def _batches_of(agent_rref) -> int:
    return agent_rref.local_value().batches


# Two steps of two observers: step 1's actions are (1, 0), step 2's (0, 1).
_STEPS = [[[1.0, 1, 1, 1], [-1.0, -1, -1, -1]], [[-2.0, 0, 0, 0], [0.0, 2, 0, 0]]]


def _ask(select_action, agent_rref, index: int) -> list:
    """Runs on an observer: its states of ``_STEPS``, asked one by one; actions or an error."""
    actions = []
    for step in _STEPS:
        try:
            actions.append(rpc.rpc_sync(agent_rref.owner(), select_action,
                                        args=(agent_rref, index, step[index]), timeout=_PATIENCE))
        except Exception as e:  # the check reports it
            return actions + [f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"]
    return actions


@CHECKS.exercise("rl.discounted_returns")
def _check_discounted_returns(discounted_returns) -> str:
    rewards, gamma = [1.0, 2.0, 3.0], 0.5
    expected = [1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0]
    got = _call(discounted_returns, rewards, gamma, what="discounted_returns([1, 2, 3], 0.5)",
                none_hint="return the list of returns, one per step")
    got = [float(g) for g in got] if isinstance(got, (list, tuple)) else got
    back = ("walk the rewards from the last: g = r + gamma * g, append g, and reverse the "
            "list at the end")
    if got == expected[::-1]:
        raise _Wrong(f"discounted_returns gave {got}: the returns are in reverse order", back)
    if got == [1.0, 1 + 0.5 * 2, 1 + 0.5 * 2 + 0.25 * 3]:
        raise _Wrong(f"discounted_returns gave {got}: each step's return summed the rewards "
                     "before it; a return sums the rewards from that step on", back)
    if not (isinstance(got, list) and len(got) == 3
            and all(abs(g - e) < 1e-6 for g, e in zip(got, expected))):
        raise _Wrong(f"discounted_returns([1, 2, 3], 0.5) gave {_show(got)}; expected "
                     f"{expected}", back)
    return "[1, 2, 3] with gamma 0.5 gives [2.75, 3.5, 3.0]"


@CHECKS.exercise("rl.select_action")
def _check_select_action(select_action) -> str:
    if callable(select_action) and not torch_compat.is_async_execution(select_action):
        raise _Wrong("select_action is not decorated with @rpc.functions.async_execution: "
                     "torch would send back the Future itself instead of waiting for its value",
                     "put @rpc.functions.async_execution on the line above def select_action")
    # Called here first, as a batch of one: an unfinished answer is named before it runs
    # on the observers' behalf.
    probe = _call(select_action, rpc.RRef(_Agent(1)), 0, [0.0] * 4,
                  what="select_action(agent_rref, 0, state)",
                  none_hint="return the Future of this observer's action, `mine`")
    if not isinstance(probe, torch_compat.CppFuture):  # what then() makes is the base class
        raise _Wrong(f"select_action returned {_show(probe)}; expected a Future of the action",
                     "return mine = agent.future.then(lambda f: f.value()[observer_id].item())")
    agent = rpc.RRef(_Agent(2))
    futures = [rpc.rpc_async(o, _ask, args=(select_action, agent, i))
               for i, o in enumerate(_OBSERVERS)]
    got = _call(torch.futures.wait_all, futures, what="two observers asking select_action")
    _judge_actions(got, _batches_of(agent))
    return "two observers got their actions from one run of the policy per step, two steps"


def _judge_actions(got: list, batches: int) -> None:
    """Raise ``_Wrong`` unless each observer got its two actions from one batch per step."""
    expected = [[1, 0], [0, 1]]  # per observer, its two steps
    for name, actions in zip(_OBSERVERS, got):
        failed = [a for a in actions if isinstance(a, str)]
        if failed and len(actions) == 1:
            raise _Wrong(f"{name} got no action in step 1: {failed[0]}",
                         "when the last observer of a batch arrives (pending reaches 0), run "
                         "agent.act on agent.states and set_result of agent.future with it")
        if failed:
            raise _Wrong(f"{name} got no action in step 2, after step 1 had worked: {failed[0]}",
                         "after a batch, reset agent.pending to the number of observers and "
                         "put a new torch.futures.Future() in agent.future")
    if batches > len(_STEPS):
        raise _Wrong(f"the agent ran its policy {batches} times for 2 steps of 2 observers: "
                     "once per observer, not once per batch",
                     "store each state in agent.states and call agent.act only when the last "
                     "observer of the step has arrived")
    if got != expected:
        stale = got == [[1, 1], [0, 0]]
        raise _Wrong(f"the observers got the actions {got}; expected {expected}" +
                     (": step 2 got step 1's actions again" if stale else ""),
                     "each observer's future is agent.future.then(lambda f: "
                     "f.value()[observer_id].item()), taken before the batch completes; after "
                     "set_result, put a new Future in agent.future")


class _Observer:
    """The checks' observer: ``steps`` steps of a game of fixed states, 1 reward each."""

    def __init__(self, index):
        self.index = index

    def run_episode(self, agent_rref, steps):
        total = 0.0
        for step in range(steps):
            state = _STEPS[step % 2][self.index]
            rpc.rpc_sync(agent_rref.owner(), _select_action, args=(agent_rref, self.index, state),
                         timeout=_PATIENCE)
            total += 1.0
        return total


@rpc.functions.async_execution
def _select_action(agent_rref, observer_id, state):
    agent = agent_rref.local_value()
    agent.states[observer_id] = torch.as_tensor(state, dtype=torch.float32)
    mine = agent.future.then(lambda f: f.value()[observer_id].item())
    with agent.lock:
        agent.pending -= 1
        if agent.pending == 0:
            agent.pending = len(agent.states)
            batch, agent.future = agent.future, torch.futures.Future()
            batch.set_result(agent.act(agent.states))
    return mine


@CHECKS.exercise("rl.play_round")
def _check_play_round(play_round) -> str:
    agent = rpc.RRef(_Agent(2))
    observers = [rpc.remote(o, _Observer, args=(i,)) for i, o in enumerate(_OBSERVERS)]
    totals = _call(play_round, agent, observers, 4, what="play_round(agent_rref, observers, 4)",
                   none_hint="return the observers' rewards, one number per observer",
                   hints=[(_TIMED_OUT, _ONE_BY_ONE)])
    if not isinstance(totals, (list, tuple)) or [float(t) for t in totals] != [4.0, 4.0]:
        raise _Wrong(f"play_round returned {_show(totals)}; expected [4.0, 4.0], each "
                     "observer's reward, in the order of observers",
                     "return [f.wait() for f in futures], one future per observer")
    return "both observers played 4 steps at the same time, one batch per step"

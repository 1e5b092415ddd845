"""Waiting on a call in a way the stop button can end (Ctrl-C, a stop of the served call).

torch's ``Future.wait`` blocks in C++, where Python cannot deliver ``KeyboardInterrupt``:
``wait`` waits instead on a lock the future's done-callback releases, in steps, asking
meanwhile whether the worker is gone and answering a member's debugger prompts;
``in_background`` runs a blocking call on a helper thread while the caller so waits.
"""

from __future__ import annotations

import _thread
import functools
import threading
from collections.abc import Callable

from .._compat import torch_compat
from ..recording.functions import destination_name
from . import fetch_threads, interrupts, stopping
from .failures import worker_fate
from .prompts import answer_waiting, poll_interval

# How often a waiting call asks whether its worker is still there.
FATE_POLL = 0.5
_CFuture = torch_compat.CppFuture  # torch's C++ future, under torch.futures.Future's Python methods


def wait(fut, to, served: interrupts.Served | None = None) -> None:
    """On the main thread, or serving a call (``served``, whose stop ends the wait), wait
    for ``fut`` in a way Ctrl-C can interrupt: a lock released by its done-callback (a
    lock's timed acquire costs no CPU, where polling ``done()`` took a core)."""
    # torch's C++ future's own methods: a ``NamedFuture``'s Python ones only call them.
    if _CFuture.done(fut) or (served is None and threading.get_ident() != threading.main_thread().ident):
        return
    done = _thread.allocate_lock()
    done.acquire()
    _CFuture.add_done_callback(fut, functools.partial(_release, done))
    if served is None:
        await_release(done, to)
    else:
        stopping.wait_served(served, done, lambda: await_release(done, to))


def _release(done, _) -> None:
    """A future's done-callback, on a torch thread: ``done`` released, unless a stop of the
    waiting call released it first."""
    torch_compat.keep_thread_state()  # its next callback runs sooner
    interrupts.release(done)


def await_release(done, to) -> None:
    """Wait until ``done`` (a held lock) is released, in steps Ctrl-C can interrupt,
    giving up if the worker is gone."""
    while not done.acquire(timeout=poll_interval(FATE_POLL)):
        answer_waiting()  # a member's pdb prompting in this cell
        # A worker whose link went silent never answers, and torch would
        # wait out the whole RPC timeout to say so.
        if worker_fate(destination_name(to)):
            raise RuntimeError("no reply: the worker is gone")


def in_background(call: Callable, to):
    """``call()`` on a helper thread while this one waits interruptibly."""
    helper = fetch_threads.take()
    done = helper.start(call)
    try:
        await_release(done, to)
    except BaseException:
        helper.abandon()
        raise
    return helper.outcome()

"""Serve the Python functions of calls so that functions that block (a nested
``rpc_sync``, a lock, a queue) can never take all of torch's RPC threads.

torch serves every request on a fixed pool of threads (``num_worker_threads``, 16 by
default) and runs the function on the thread that took the request; the replies to a
member's own calls need the same pool. Functions that wait on other calls can so
take every thread, and nothing answers again: the classic RPC pool deadlock. nbrpc
sends a Python function as an ``@rpc.functions.async_execution`` one
(``interrupts.Stoppable``), and the member runs it on the torch thread that took it
while few of them do (a thread switch costs a small call several percent), and else
hands it to a thread of its own, which grow in number: torch's thread goes back to
its pool at once, and the reply leaves when the function returns. torch's pool so
always keeps ``reserve(threads)`` threads for hand-offs and replies.

Parts:

- ``ThreadState``: what torch set on its thread for the call, taken there and put in
  place on the serving thread: the distributed autograd context the request carries
  (so nested calls and tensors join it), grad mode, and on a CUDA member the current
  stream of each device (torch's per-request streams).
- ``Pool``: idle threads each waiting on a lock of its own; a hand-off wakes one
  (one futex wake) or starts a new one when none is idle. A thread idle for
  ``IDLE_EXIT`` seconds ends, so an idle member keeps few threads.
- ``serve(run, args, kwargs)``: from torch's thread, a Future of
  ``run(*args, **kwargs)`` (which must not raise: it returns what torch sends back, a
  ``RemoteException`` included), run here or handed off (``hand_off``).
- ``ON_CALL``: callables run on the serving thread as each call begins (a debugger
  attached to this member makes the thread known to it: torch's threads are made by
  C++, so no Python debugger saw them start); while it is empty a call pays one check.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import torch

from .._compat import torch_compat
from .._util import Hooks
from ..wire.receivers import receivers

# How long a serving thread waits for work before it ends (seconds).
IDLE_EXIT = 30.0
# An inline limit no pool reaches: every call on torch's own threads.
TORCH_THREADS_ONLY = 1 << 30
# Run on the serving thread as each call begins, before its function.
ON_CALL = Hooks()


def reserve(threads: int) -> int:
    """How many of torch's ``threads`` never run a call's function."""
    return max(2, threads // 4)


class ThreadState:
    """The thread-local state torch sets for a request, carried to another thread."""

    __slots__ = ("context_id", "grad", "streams")

    def __init__(self):
        self.context_id = torch_compat.thread_context_id()
        self.grad = torch.is_grad_enabled()
        self.streams = _current_streams()

    def enter(self) -> None:
        torch_compat.set_thread_context_id(self.context_id)
        torch.set_grad_enabled(self.grad)
        for stream in self.streams:
            torch.cuda.set_stream(stream)

    @staticmethod
    def leave() -> None:
        """Back to a fresh thread's state, for the thread's next call."""
        torch_compat.set_thread_context_id(-1)
        torch.set_grad_enabled(True)


def _current_streams() -> tuple:
    # Only where CUDA is in use already: asking initializes it.
    if not torch.cuda.is_initialized():
        return ()
    return tuple(torch.cuda.current_stream(d) for d in range(torch.cuda.device_count()))


def _devices(state: ThreadState) -> list:
    # A future that carries CUDA tensors names their devices (torch records events on
    # the current streams as it completes, as it does for its own replies).
    return [s.device for s in state.streams]


class _Server:
    """One serving thread: waits on ``wake`` for a job."""

    __slots__ = ("wake", "job")

    def __init__(self):
        self.wake = threading.Lock()
        self.wake.acquire()
        self.job: Callable[[], None] | None = None


class Pool:
    """Threads that run handed-off calls; as many as calls run at once."""

    def __init__(self):
        self._lock = threading.Lock()
        self._idle: list[_Server] = []
        self.threads = 0  # serving threads alive
        self.busy = 0  # of which run a call now
        self.inline = 0  # calls running on torch's threads
        self.inline_limit: int | None = None  # at most this many (known once serving)

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self.busy += 1
            server = self._idle.pop() if self._idle else None
            if server is None:
                self.threads += 1
        if server is None:
            server = _Server()
            server.job = job
            threading.Thread(target=self._serve, args=(server,), daemon=True,
                             name=f"nbrpc-serve-{self.threads}").start()
        else:
            server.job = job
        server.wake.release()

    def _serve(self, server: _Server) -> None:
        while True:
            if not server.wake.acquire(timeout=IDLE_EXIT):
                with self._lock:
                    if server in self._idle:  # nobody is handing it a job: end
                        self._idle.remove(server)
                        self.threads -= 1
                        return
                server.wake.acquire()  # a job is on its way
            job, server.job = server.job, None
            job()
            with self._lock:
                self.busy -= 1
                self._idle.append(server)

    def serve_on_torch_threads(self, on: bool = True) -> None:
        """Run every call's function on the torch thread that took it, as torch does (its
        pool deadlock included: what a lesson on it shows), or (``False``) hand off again."""
        with self._lock:
            self.inline_limit = TORCH_THREADS_ONLY if on else None

    def find_inline_limit(self) -> int:
        size = int(torch_compat.current_agent().get_debug_info()["agent.thread_pool_size"])
        self.inline_limit = max(0, size - reserve(size))
        return self.inline_limit

    def reset(self) -> None:
        """After a fork: the parent's threads are not in the child."""
        self.__init__()


pool = Pool()
os.register_at_fork(after_in_child=pool.reset)


def serve_on_torch_threads(on: bool = True) -> None:
    """This member's ``pool.serve_on_torch_threads`` (a function: it travels by name)."""
    pool.serve_on_torch_threads(on)


def _beginning() -> None:
    for hook in ON_CALL:
        hook()


def serve(run: Callable, args: tuple, kwargs: dict) -> torch.futures.Future:
    """``run(*args, **kwargs)``'s Future: run on this torch thread while fewer than the
    limit do (counted in ``pool.inline`` meanwhile), else on a serving thread (``hand_off``).
    One frame: it serves every call."""
    limit = pool.inline_limit
    with pool._lock:
        inline = pool.inline < (pool.find_inline_limit() if limit is None else limit)
        if inline:
            pool.inline += 1
    if not inline:
        return hand_off(run, args, kwargs)
    try:
        if ON_CALL.callables:
            _beginning()
        value = run(*args, **kwargs)
    finally:
        with pool._lock:
            pool.inline -= 1
    fut = torch_compat.new_future(_devices(ThreadState()) if torch.cuda.is_initialized() else [])
    fut.set_result(value)
    return fut


def hand_off(run: Callable, args: tuple, kwargs: dict) -> torch.futures.Future:
    """Run ``run(*args, **kwargs)`` on a serving thread, with this thread's torch state;
    the returned Future gets its value (``run`` must not raise)."""
    state = ThreadState()
    fut = torch_compat.new_future(_devices(state))

    def job() -> None:
        state.enter()
        try:
            if ON_CALL.callables:
                _beginning()
            value = run(*args, **kwargs)
        except BaseException as e:  # a stop that came as the call ended: still answer
            value = torch_compat.remote_exception(RuntimeError(f"the call ended with {e!r}"))
        try:
            fut.set_result(value)
        except BaseException as e:  # torch could not take the value (a CUDA tensor on another device)
            fut.set_exception(e)
        finally:
            ThreadState.leave()
            receivers.reply_home(None)  # pickled here or on torch's thread: the note is done

    pool.submit(job)
    return fut

"""The futures ``rpc_async`` gives (``nbrpc/calls/futures.py``): a callback's error, as torch
writes it into the text of the future ``then`` returns ("At:" and the frames from where it
was raised up the stack), lists the user's frames only, as under raw torch (the
differential check compares the two), for every way a callback reaches the outcome."""

from __future__ import annotations

import re
import time
import traceback

import pytest
import torch
import torch.distributed.rpc as rpc

HERE = __file__.removesuffix("c")
TORCH_HANDLER = rpc.internal.__file__.removesuffix("c")  # where torch re-creates a remote error
TIMEOUT = 0.3


def _sleep(seconds):
    time.sleep(seconds)
    return seconds


def _bad_value(n):
    raise ValueError(f"bad value {n}")


class BadInput(Exception):
    """A remote error of a class of the user's (torch's C++ would make it a RuntimeError)."""


def _bad_input(n):
    raise BadInput(f"bad input {n}")


def _wait(fut):
    return fut.wait()


def _error_of_wait(fut):
    """What ``fut.wait()`` raised, as the value of the callback."""
    try:
        fut.wait()
    except Exception as e:
        return e
    return None


def _call(failure: str):
    if failure == "timeout":
        return rpc.rpc_async("worker1", _sleep, args=(2.0,), timeout=TIMEOUT)
    if failure == "raises":
        return rpc.rpc_async("worker1", _bad_value, args=(3,))
    return rpc.rpc_async("worker1", _sleep, args=(0.0,))  # "callback": the callback itself fails


def _callback(failure: str):
    if failure == "callback":
        return lambda fut: fut.wait() / 0
    return _wait


FORMS = {
    "then": lambda fut, cb: fut.then(cb).wait(),
    "then after done": lambda fut, cb: _settled(fut).then(cb).wait(),
    "chained then": lambda fut, cb: fut.then(lambda f: f).then(lambda f: cb(f.wait())).wait(),
    "collect_all": lambda fut, cb: torch.futures.collect_all([fut]).then(lambda fs: cb(fs.wait()[0])).wait(),
}


def _settled(fut):
    """``fut`` once its outcome is in (a callback added then runs at once, inline)."""
    deadline = time.monotonic() + 10
    while not fut.done() and time.monotonic() < deadline:
        time.sleep(0.01)
    return fut


def _frames(text: str) -> list[str]:
    """The files of the frames listed under each "At:" of torch's text."""
    return re.findall(r"^  (.+?)\(\d+\): ", text, flags=re.M)


def _words(failure: str) -> str:
    return {"timeout": "RPC ran for more than set timeout", "raises": "bad value 3",
            "callback": "division by zero"}[failure]


@pytest.mark.parametrize("failure", ["timeout", "raises", "callback"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_callbacks_error_lists_the_users_frames_only(cluster, form, failure):
    began = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        FORMS[form](_call(failure), _callback(failure))
    text = str(info.value)
    assert text.startswith("Got the following error when running the callback: "), text
    assert _words(failure) in text, text
    assert "/nbrpc/" not in text, text
    # raised in the user's callback; above it, the stack that ran it (the caller's own
    # when the future was done: torch runs the callback at once, inline)
    in_callback = _frames(text.rsplit("\nAt:\n", 1)[-1])
    assert in_callback and in_callback[0] == HERE, text
    # before it, as in a script, only torch's handler that re-created a remote error
    # (collect_all gathers torch's own futures of the calls)
    assert set(_frames(text)[:-len(in_callback)]) <= {TORCH_HANDLER}, text
    if failure == "timeout":
        if form != "collect_all":  # collect_all gathers torch's own futures of the calls, with torch's words
            assert "got no answer within 0.3 s" in text, text  # nbrpc's words beside torch's
        assert time.monotonic() - began < TIMEOUT + 0.5


@pytest.mark.parametrize("failure", ["timeout", "raises"])
def test_a_done_callbacks_wait_raises_from_the_callback(cluster, failure):
    """``add_done_callback``: what the callback's ``wait()`` raises has the callback's
    frame as its last, as a script's has (torch logs, and drops, what a done-callback raises)."""
    seen = []

    def note(fut):
        try:
            fut.wait()
        except Exception as e:  # what the callback sees
            seen.append((type(e), str(e), traceback.extract_tb(e.__traceback__)))

    fut = _call(failure)
    fut.add_done_callback(note)
    with pytest.raises((RuntimeError, ValueError)):
        fut.wait()
    _settled(fut)
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    [(kind, text, frames)] = seen
    assert issubclass(kind, ValueError if failure == "raises" else RuntimeError), kind
    assert _words(failure) in text
    assert [f.name for f in frames] == ["note"], frames


@pytest.mark.parametrize("remote, kind", [(_bad_value, "ValueError"), (_bad_input, "BadInput")])
def test_the_callers_error_and_a_callbacks_keep_their_own_tracebacks(cluster, remote, kind):
    """The caller's ``wait()`` and a callback's, on one failed call, in either order: each
    error's traceback holds its own frames, and the later raise leaves the other's as it was."""
    for callback_first in (True, False):
        fut = rpc.rpc_async("worker1", remote, args=(3,))
        if callback_first:
            seen = _settled(fut).then(_error_of_wait).wait()
        with pytest.raises(Exception, match="bad (value|input) 3") as info:
            fut.wait()
        callers, callers_frames = info.value, traceback.extract_tb(info.value.__traceback__)
        if not callback_first:
            seen = fut.then(_error_of_wait).wait()
        assert type(callers).__name__ == type(seen).__name__ == kind
        assert seen is not callers
        assert traceback.extract_tb(callers.__traceback__) == callers_frames
        assert callers_frames[-1].name == "test_the_callers_error_and_a_callbacks_keep_their_own_tracebacks"
        assert [f.name for f in traceback.extract_tb(seen.__traceback__)] == ["_error_of_wait"], callback_first


def test_a_callback_gets_the_calls_value(cluster):
    fut = rpc.rpc_async("worker1", _sleep, args=(0.0,))
    assert fut.then(lambda f: f.value() + 1).wait() == 1
    assert fut.then(lambda f: f.wait()).then(lambda f: f.wait() * 2).wait() == 0
    assert fut.wait() == 0.0


API = rpc.api.__file__.removesuffix("c")  # torch's rpc_sync and its _require_initialized
# The files of a remote error's traceback under raw torch, from the caller's frame on.
RAW_TORCHS_FRAMES = {"rpc_sync": [HERE, API, API], "rpc_async().wait()": [HERE],
                     "remote().to_here()": [HERE, TORCH_HANDLER]}
CALL_FORMS = {"rpc_sync": lambda: rpc.rpc_sync("worker1", _bad_value, args=(3,)),
              "rpc_async().wait()": lambda: rpc.rpc_async("worker1", _bad_value, args=(3,)).wait(),
              "remote().to_here()": lambda: rpc.remote("worker1", _bad_value, args=(3,)).to_here()}


@pytest.mark.parametrize("form", sorted(CALL_FORMS))
def test_a_remote_errors_traceback_in_a_script_lists_raw_torchs_frames(cluster, form):
    """In a script driving nbrpc (this process), ``traceback.format_exception`` of a remote
    error shows the frames raw torch's shows, none of nbrpc's."""
    with pytest.raises(ValueError, match="bad value 3") as info:
        CALL_FORMS[form]()
    _assert_raw_torchs_frames(info.value, RAW_TORCHS_FRAMES[form])


# A timeout's under raw torch: raised in C++ (to_here, a future's wait) or under rpc_sync's.
RAW_TORCHS_TIMEOUT_FRAMES = {"rpc_sync": [HERE, API, API], "rpc_async().wait()": [HERE],
                             "remote().to_here()": [HERE]}
TIMEOUT_FORMS = {
    "rpc_sync": lambda: rpc.rpc_sync("worker1", _sleep, args=(1.0,), timeout=TIMEOUT),
    "rpc_async().wait()": lambda: rpc.rpc_async("worker1", _sleep, args=(1.0,), timeout=TIMEOUT).wait(),
    "remote().to_here()": lambda: rpc.remote("worker1", _sleep, args=(1.0,)).to_here(timeout=TIMEOUT)}


@pytest.mark.parametrize("form", sorted(TIMEOUT_FORMS))
def test_a_timeouts_traceback_in_a_script_lists_raw_torchs_frames(cluster, form):
    """nbrpc's timeout error (naming the call) and torch's it is chained to: no frame of
    nbrpc's in either, the caller's frames as under raw torch."""
    with pytest.raises(RuntimeError, match="got no answer within 0.3 s") as info:
        TIMEOUT_FORMS[form]()
    _assert_raw_torchs_frames(info.value, RAW_TORCHS_TIMEOUT_FRAMES[form])
    assert "RPC ran for more than set timeout" in str(info.value.__cause__)


def _assert_raw_torchs_frames(error: BaseException, raw_torchs: list[str]) -> None:
    text = "".join(traceback.format_exception(error))
    assert "/nbrpc/" not in text, text
    files = [frame.filename for frame in traceback.extract_tb(error.__traceback__)]
    last_own = len(files) - 1 - files[::-1].index(HERE)  # the lambda of the forms
    assert files[last_own:] == raw_torchs, text


def test_a_futures_unwrap_raises_in_its_wait_and_value():
    """torch's private hook the views use (``_compat/future_unwrap``), still there."""
    from nbrpc._compat.future_unwrap import set_unwrap
    from nbrpc.calls.futures import RAISE

    fut = torch.futures.Future()
    set_unwrap(fut, RAISE)
    fut.set_result(KeyError("held"))
    for read in (fut.wait, fut.value):
        with pytest.raises(KeyError, match="held"):
            read()

"""Every private part of torch that nbrpc uses, and every patch it makes to torch.

torch RPC's public API has no driver that joins once while workers come and go, no
pickles that carry notebook definitions, no waits Ctrl-C can interrupt, no RRef
ledger; nbrpc reaches into torch's internals for them, here and nowhere else. Each
name says what nbrpc uses it for and the torch version it is known to work with;
``tests/test_compat.py`` reads every one (and ``check`` the private methods of
torch's C++ classes), so a torch upgrade that moves one fails there, in one place.

Parts:

- Names: functions, classes and constants, taken from torch when this module loads.
- Methods of torch's C++ objects, called through small functions
  (``update_group_membership``, ``fork_data``, ``send_functions`` ...).
- Patch points: where nbrpc puts its functions in place of torch's. ``patch``
  replaces one and remembers torch's (``calls.patches.install`` puts every patch of a
  member in place), ``uninstall()`` puts torch's own back; ``stand_in`` names what
  stood or stands at a patch point, for the pickler.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import traceback

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch._C._distributed_autograd import DistAutogradContext
from torch._C._distributed_rpc import PyRRef, TensorPipeAgent
from torch.distributed.rpc import api, internal, rref_proxy
from torch.distributed.rpc.constants import UNSET_RPC_TIMEOUT  # noqa: F401 (re-exported)
from torch.distributed.rpc.internal import PythonUDF, RemoteException, RPCExecMode  # noqa: F401

from ..errors import remote_class

# -- joining and leaving ---------------------------------------------------------

# Starts this process's agent with nbrpc's store, prefix and rank, and no world size
# (dynamic membership); known to work with torch 2.11 to 2.15.
init_rpc_backend = rpc._init_rpc_backend
# Distributed autograd's per-process state, set up before the agent starts (what
# init_rpc does); known to work with torch 2.11 to 2.15.
init_dist_autograd = dist_autograd._init
# This process's agent: its members, its own info, its debug counters; known to work with torch 2.11 to 2.15.
current_agent = api._get_current_rpc_agent
# Whether this process has an agent (is a member); known to work with torch 2.11 to 2.15.
has_agent = api._is_current_rpc_agent_set
# The default timeout of an agent that joined for an earlier cluster; known to work with torch 2.11 to 2.15.
set_rpc_timeout = rpc._set_rpc_timeout
# The node id torch's profiler gives this process's events (init_rpc sets the rank
# before the agent starts; the default, -1, leaves the profiler's "Node ID" empty);
# known to work with torch 2.11 to 2.15.
set_profiler_node_id = rpc._set_profiler_node_id
# torch's API-usage log entry for init_rpc (a no-op unless a logging hook is set);
# known to work with torch 2.11 to 2.15.
INIT_RPC_USAGE = "torch.distributed.init_rpc"
log_api_usage = torch._C._log_api_usage_once


def count_init() -> None:
    """What ``init_rpc`` does to ``rpc._init_counter`` (the number of its store prefix,
    ``rpc_prefix_N``), under its lock: a member that joined counts as one init, as in a
    script; known to work with torch 2.11 to 2.15."""
    with rpc._init_counter_lock:
        rpc._init_counter += 1

# Busy threads and owned RRefs of this member (%rpc_status); known to work with torch 2.11 to 2.15.
debug_info = rpc._get_debug_info
# This member's RRef counters (owned RRefs in the ledger's report); known to work with torch 2.11 to 2.15.
rref_debug_info = rpc._rref_context_get_debug_info
# Deletes this member's UserRRefs on their owners and waits (up to a timedelta) until
# the users of its own RRefs did the same: what a static group's graceful shutdown
# does, and a dynamic member's leave does not; known to work with torch 2.11 to 2.15.
delete_all_rrefs = api._delete_all_user_and_unforked_owner_rrefs
# The store key of torch's join/leave lock, freed for a worker that died holding it;
# known to work with torch 2.11 to 2.15.
STORE_LOCK_KEY = "RpcGroupManagementToken"
# The store key of the member list ("NAME-RANK," each), cleaned of workers that died;
# known to work with torch 2.11 to 2.15.
STORE_MEMBERS_KEY = "names/_ALL_WORKER_INFOS"
# The keyword of TensorPipeRpcBackendOptions that picks its transports (uv, shm);
# known to work with torch 2.11 to 2.15.
TRANSPORTS_OPTION = "_transports"


# TensorPipeAgent's constructor and _update_group_membership, kept before nbrpc follows
# the agent's devices through them (calls.agent_devices); known to work with torch 2.11 to 2.15.
agent_init = TensorPipeAgent.__init__
agent_update_group_membership = TensorPipeAgent._update_group_membership


def update_group_membership(agent, info, devices: list, maps: dict, joined: bool) -> None:
    """``TensorPipeAgent._update_group_membership``: forget a member that died, set this
    member's devices and reply maps; known to work with torch 2.11 to 2.15."""
    agent._update_group_membership(info, devices, maps, joined)


# -- torch's threads running Python ------------------------------------------------

_threads_with_kept_state: set[int] = set()  # idents of threads whose Python thread state is kept


def keep_thread_state() -> None:
    """Keep the Python thread state of the torch thread running this, for its life.

    torch's RPC threads are not Python threads: each time one runs Python (a function
    called over RPC, a future's callback, a reply's pickle), pybind11's
    ``gil_scoped_acquire`` makes a new thread state and deletes it afterwards, which
    cost about 80 us per small call here (and thread-locals that never last). One
    ``PyGILState_Ensure`` never released raises the state's count, so pybind11 keeps
    it: the next Python on this thread reuses it. Once per thread; known to work with
    torch 2.11 to 2.15 (pybind11's gil_scoped_acquire) and CPython 3.11.
    """
    me = threading.get_ident()
    if me not in _threads_with_kept_state:
        _threads_with_kept_state.add(me)
        ctypes.pythonapi.PyGILState_Ensure()


def _container_function(name: str, restype, argtypes):
    """A static method of torch's C++ ``DistAutogradContainer``, through ctypes."""
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
    function = getattr(lib, f"_ZN5torch11distributed8autograd21DistAutogradContainer{name}")
    function.restype, function.argtypes = restype, argtypes
    return function


# The distributed autograd context of this thread (-1: none), read and set as torch's
# own ThreadLocalState does when it moves a request's work to another thread
# (DistAutogradContainer::currentContextId and forceCurrentContextId, static C++
# methods with no Python binding); known to work with torch 2.11 to 2.15.
_current_context_id = _container_function("16currentContextIdEv", ctypes.c_int64, [])
_force_context_id = _container_function("21forceCurrentContextIdEl", None, [ctypes.c_int64])


# torch's C++ future class under torch.futures.Future: what ``then`` makes, whose methods nbrpc
# calls directly; and a bare one (taking its devices), a microsecond cheaper to make than the
# Python subclass, one per call nbrpc serves; known to work with torch 2.11 to 2.15.
CppFuture = new_future = torch._C.Future


def thread_context_id() -> int:
    """The id of this thread's distributed autograd context, -1 if none."""
    return _current_context_id()


def set_thread_context_id(context_id: int) -> None:
    """Make ``context_id`` (-1: none) this thread's distributed autograd context."""
    _force_context_id(context_id)


# -- calls -------------------------------------------------------------------------

# Resolves every call's destination (unknown names get nbrpc's error); known to work with torch 2.11 to 2.15.
to_worker_info = api._to_worker_info
# Sends one call with an explicit exec mode (rpc_sync/rpc_async without torch's
# wrappers, so a call can carry a call id); known to work with torch 2.11 to 2.15.
invoke_rpc = api._invoke_rpc
# The C++ calls under those two for a Python function; known to work with torch 2.11 to 2.15.
_invoke_rpc_python_udf = torch._C._distributed_rpc._invoke_rpc_python_udf
_invoke_remote_python_udf = torch._C._distributed_rpc._invoke_remote_python_udf

# The branches of torch's ``_invoke_rpc`` and ``remote`` by kind of callable: a builtin operator
# and a TorchScript function (also under @async_execution) go by name, anything else pickled;
# known to work with torch 2.11 to 2.15 (``tests/test_compat.py`` walks them for each kind).
BUILTIN, SCRIPT, PYTHON = "builtin", "script", "python"


def call_kind(func) -> tuple[str, bool]:
    """The branch torch's ``_invoke_rpc`` and ``remote`` take for ``func``, and whether they
    send it as an ``@async_execution`` function: their own tests, in their order."""
    is_async = is_async_execution(func)
    if find_builtin(func) is not None:
        return BUILTIN, is_async
    if is_async and isinstance(getattr(func, ASYNC_EXECUTION_MARK), torch.jit.ScriptFunction):
        return SCRIPT, True
    return (SCRIPT if isinstance(func, torch.jit.ScriptFunction) else PYTHON), is_async


def send_python_call(to, func, args, kwargs, timeout: float, mode: RPCExecMode, kind: tuple | None = None):
    """torch's ``_invoke_rpc`` with ``mode`` (``REMOTE``: torch's ``remote``), without its lookups and profiling
    context for a Python function (``call_kind``, or ``kind``: known to the caller), its ``PythonUDF`` made in C,
    while no profiler runs; any other callable, and any call while a profiler runs, goes to torch's own."""
    kind, is_async = kind or call_kind(func)
    remote = mode == RPCExecMode.REMOTE
    if kind != PYTHON or profiler_enabled():
        if remote:
            return _torch_remote(to, func, args, kwargs, timeout)
        return invoke_rpc(to, func, mode, args, kwargs, timeout)
    info = api._to_worker_info(to)
    pickled, tensors = pickle_message(tuple.__new__(PythonUDF, (func, args or (), kwargs or {})))
    send = _invoke_remote_python_udf if remote else _invoke_rpc_python_udf
    return send(info, pickled, tensors, timeout, is_async)


# The decorator torch puts on its calls ("RPC has not been initialized"); known to work with torch 2.11 to 2.15.
require_initialized = api._require_initialized
# Per-thread state where torch's _wait_all collects the futures of rpc_async;
# known to work with torch 2.11 to 2.15.
call_thread_state = api._thread_local_var
# torch's own rpc_sync, rpc_async and remote, which nbrpc's wrappers call;
# public names, kept here before nbrpc replaces them.
rpc_sync = api.rpc_sync
rpc_async = api.rpc_async
remote = _torch_remote = api.remote  # (send_python_call's own name for it)
# What torch.futures.wait_all and collect_all call at each call (so it is found however
# they were imported): one future done when all are, or at once with the first error
# torch's C++ future holds; known to work with torch 2.11 to 2.15.
collect_all = torch._C._collect_all
# Tells a Python function torch sends as such from a builtin operator (which it
# sends differently, so no call id); known to work with torch 2.11 to 2.15.
find_builtin = torch.jit._builtins._find_builtin
# The attribute @rpc.functions.async_execution marks a function with; known to work with torch 2.11 to 2.15.
ASYNC_EXECUTION_MARK = "_wrapped_async_rpc_function"


def mark_async_execution(target):
    """Mark ``target`` (a function, or a class whose instances are called) as
    ``@rpc.functions.async_execution`` does, and return it: torch runs it as one returning a
    Future, its reply sent once that completes; known to work with torch 2.11 to 2.15."""
    setattr(target, ASYNC_EXECUTION_MARK, target)
    return target


def is_async_execution(func) -> bool:
    """Whether torch runs ``func`` as an ``@rpc.functions.async_execution`` function."""
    return hasattr(func, ASYNC_EXECUTION_MARK)
# internal.PythonUDF (the function and arguments of a call being pickled, named in
# pickling errors), internal.RPCExecMode (SYNC, ASYNC) and constants.UNSET_RPC_TIMEOUT
# are imported above; known to work with torch 2.11 to 2.15.

# -- pickling and remote errors ----------------------------------------------------


def remote_exception(error: Exception, show: bool = True) -> RemoteException:
    """What torch's ``internal._run_function`` makes of an error a function raised while
    serving a call: it prints the worker, the error and its traceback to stderr (unless
    not ``show``), and returns a ``RemoteException`` that torch sends as the reply (the
    caller re-raises it). Done by nbrpc inside the call, so that the print is the call's
    output; the same text and reply as torch 2.11's to 2.15's."""
    text = f"On {current_agent().get_worker_info()}:\n{error!r}\n{traceback.format_exc()}"
    if show:
        print(text, file=sys.stderr)
    # A remote error passed on keeps the class it was raised in (not the one nbrpc
    # derived from it and RuntimeError on arrival, which only this process has).
    return RemoteException(text, remote_class(error))


# The pickler class torch's RPC pickles with, and the method that pickles each message
# with a new pickler; known to work with torch 2.11 to 2.15.
torch_pickler = internal._pickler
torch_serialize = internal._InternalRPCPickler.serialize


def pickler_class() -> type:
    """The pickler class torch's RPC is set to pickle messages with now."""
    return internal._pickler


def set_pickler_class(cls: type) -> None:
    """Make ``cls`` torch's RPC pickler class (a benchmark's; known to work with torch 2.11 to 2.15)."""
    internal._pickler = cls


def pickle_message(message) -> tuple[bytes, list]:
    """A message pickled as torch's RPC does: the pickle and the tensors beside it (torch 2.11 to 2.15)."""
    return api._default_pickler.serialize(message)


# Re-creates a remote exception on the caller (internal.RemoteException, imported above):
# calls its exception_type with its text; known to work with torch 2.11 to 2.15.
handle_exception = internal._handle_exception

# -- RRefs -------------------------------------------------------------------------

# torch._C._distributed_rpc.PyRRef (imported above) is the RRef class the ledger hooks;
# its constructor and to_here, kept before nbrpc replaces them.
rref_init = PyRRef.__init__
to_here = PyRRef.to_here
# Rebuilds an RRef from its fork data on the receiver; known to work with torch 2.11 to 2.15.
rref_from_fork_data = PyRRef._deserialize
# The functions an RRef helper (``rref.rpc_sync().method(...)``) runs on the owner,
# named by the method in the timeline; known to work with torch 2.11 to 2.15.
RREF_HELPERS = (rref_proxy._local_invoke, rref_proxy._local_invoke_async_execution)
MESSAGE_GLOBALS = (PythonUDF, *RREF_HELPERS)  # a call's and a helper's, RPC's alone: by code (serialization.EXTENSIONS)


def fork_data(rref) -> tuple:
    """``PyRRef._serialize``: an RRef's fork as torch pickles it (owner, created_on,
    local_id, fork id, parent, type); registers the fork. Known to work with torch 2.11 to 2.15."""
    return rref._serialize()


def creation_future(rref) -> torch.futures.Future:
    """``PyRRef._get_future``: done when the owner confirmed an RRef ``remote`` made
    (the timeline's reply); known to work with torch 2.11 to 2.15. Not for a forked RRef."""
    return rref._get_future()


def rref_type(rref) -> type:
    """``PyRRef._get_type``: the class of an RRef's value (asks the owner once);
    known to work with torch 2.11 to 2.15. Asked first without blocking (an RRef's
    proxy does), torch keeps and returns the future of the answer, not the class."""
    found = rref._get_type(blocking=True)
    return found.wait() if isinstance(found, torch._C.Future) else found


# -- distributed autograd ----------------------------------------------------------

# A live distributed autograd context by id; known to work with torch 2.11 to 2.15.
retrieve_context = dist_autograd._retrieve_context
# torch's own backward, kept before recording replaces it.
backward = dist_autograd.backward
# The functions DistributedOptimizer.step sends to each owner of parameters, with the
# optimizer's RRef and the context id (the timeline's optimizer steps): the plain one, and
# the one for torch's functional optimizers, compiled with TorchScript up to torch 2.14
# (``_script_``) and plain Python from 2.15 (``_functional_``). Names only: importing
# torch.distributed.optim takes most of a second; ``tests/test_compat.py`` checks that
# every name the installed torch's ``step`` sends is here.
OPTIMIZER_STEPS = ("_local_optimizer_step", "_script_local_optimizer_step", "_functional_local_optimizer_step")


def context_creator(context_id: int) -> int:
    """The worker id of the member that created a distributed autograd context: torch's
    ids carry it above their 48-bit counter (``DistAutogradContainer``); known to work
    with torch 2.11 to 2.15."""
    return context_id >> 48


# Whether a profiler records on this thread (it records each call's events on the
# thread that makes it); known to work with torch 2.11 to 2.15.
profiler_enabled = torch.autograd._profiler_enabled


def current_context_id() -> int:
    """The id of this thread's distributed autograd context (``RuntimeError``: none);
    known to work with torch 2.11 to 2.15."""
    return dist_autograd._current_context()._context_id()


def context_id_or_none() -> int | None:
    """``current_context_id``, or None outside a context, without the C++ exception
    (about 20 us) that ``_current_context`` raises there (``thread_context_id``)."""
    context_id = _current_context_id()
    return None if context_id == -1 else context_id


def send_functions(context) -> dict:
    """``DistAutogradContext._send_functions``: message id -> SendRpcBackward;
    known to work with torch 2.11 to 2.15."""
    return context._send_functions()


def recv_functions(context) -> dict:
    """``DistAutogradContext._recv_functions``: message id -> RecvRpcBackward;
    known to work with torch 2.11 to 2.15."""
    return context._recv_functions()


def known_worker_ids(context) -> set:
    """``DistAutogradContext._known_worker_ids``: workers the context reached;
    known to work with torch 2.11 to 2.15."""
    return context._known_worker_ids()


# The private methods above, checked to exist by ``check``.
METHODS = ((TensorPipeAgent, "_update_group_membership"), (PyRRef, "_serialize"),
           (PyRRef, "_get_future"), (PyRRef, "_get_type"), (DistAutogradContext, "_context_id"),
           (DistAutogradContext, "_send_functions"), (DistAutogradContext, "_recv_functions"),
           (DistAutogradContext, "_known_worker_ids"), (internal._InternalRPCPickler, "_py_rref_reducer"),
           (internal._InternalRPCPickler, "_rref_reducer"), (internal._InternalRPCPickler, "_script_module_reducer"))


def check() -> None:
    """Raise ``AttributeError`` naming any private method torch no longer has."""
    missing = [f"{cls.__name__}.{name}" for cls, name in METHODS if not hasattr(cls, name)]
    if missing:
        raise AttributeError(f"this torch ({torch.__version__}) lacks {', '.join(missing)}, which "
                             "nbrpc needs (known to work with torch 2.11 to 2.15)")


# -- pickled bytes ---------------------------------------------------------------

# Per-thread tables of the tensors a message carries beside its pickle
# (``send_tables``, ``recv_tables``), counted by the timeline; known to work with torch 2.11 to 2.15.
tensor_tables = internal._thread_local_tensor_tables


# -- patches -----------------------------------------------------------------------

# Where nbrpc puts its own functions in place of torch's: (owner, attribute) pairs.
PICKLER = ((internal, "_pickler"),)
UNPICKLER = ((internal, "_unpickler"),)
SERIALIZE = ((internal._InternalRPCPickler, "serialize"),)
TO_WORKER_INFO = ((api, "_to_worker_info"),)
RPC_SYNC = ((api, "rpc_sync"), (rpc, "rpc_sync"))
RPC_ASYNC = ((api, "rpc_async"), (rpc, "rpc_async"))
REMOTE = ((api, "remote"), (rpc, "remote"))
RREF_INIT = ((PyRRef, "__init__"),)
RREF_TO_HERE = ((PyRRef, "to_here"),)
COLLECT_ALL = ((torch._C, "_collect_all"),)
BACKWARD = ((dist_autograd, "backward"),)
# A Python-made Future's site (``recording.futures``): torch's own __init__ is Python.
FUTURE_INIT = ((torch.futures.Future, "__init__"),)
AGENT_INIT = ((TensorPipeAgent, "__init__"),)
AGENT_GROUP_MEMBERSHIP = ((TensorPipeAgent, "_update_group_membership"),)

_originals: dict[tuple, object] = {}
# Everything that stood or stands at a patch point, torch's and nbrpc's alike:
# id -> (the object, its owner, its name). The pickler sends these by that name, so
# that each lands as the receiving process's own (``stand_in``).
_at_points: dict[int, tuple] = {}


def patch(point: tuple, value) -> None:
    """Put ``value`` at every place of ``point``; ``uninstall`` puts torch's back."""
    for owner, name in point:
        original = _originals.setdefault((owner, name), getattr(owner, name))
        setattr(owner, name, value)
        for obj in (original, value):
            _at_points.setdefault(id(obj), (obj, owner, name))


def stand_in(obj) -> tuple | None:
    """``(owner, name)`` if ``obj`` is torch's object at a patch point or nbrpc's in its
    place, else None.

    A notebook may hold either (``from torch.distributed.rpc import remote`` before or
    after nbrpc patched it, an alias, a default argument): both mean "this process's
    ``owner.name``", as in a script importing torch. By value they would not travel
    (a wrapper's globals hold locks), and torch's original no longer resolves by name.
    """
    found = _at_points.get(id(obj))
    return found[1:] if found is not None and found[0] is obj else None


def stand_in_count() -> int:
    """How many objects stand or stood at patch points: it grows as ``patch`` puts new ones."""
    return len(_at_points)


def uninstall() -> None:
    """Put torch's own functions back everywhere nbrpc patched them."""
    for (owner, name), original in _originals.items():
        setattr(owner, name, original)
    _originals.clear()

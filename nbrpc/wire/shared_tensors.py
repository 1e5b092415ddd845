"""Big CPU tensors between the members of a local cluster: one memcpy each way.

torch sends a tensor between two members on one host through TensorPipe's ``cma``
channel: the receiver reads it out of the sender with ``process_vm_readv`` into a new
tensor, whose pages are faulted in as it lands. A 100 MiB round trip took 2.7x two
memcpys of it. Here a member that sends a big tensor copies it, as it pickles the
message, into a segment of shared memory it keeps faulted in (``Pool``; a ``memfd``,
which has no name in any file system and is freed with the last process that maps
it; in huge pages where the system allows, see ``mapped``), and the message carries only
the segment's handle. The receiver maps the segment (the mapping is kept for the next
message) and its tensor is that memory: no copy. When the receiver's tensor is freed
(its last view), the segment's header says so and the sender uses it again. A round
trip is two memcpys.

Copy semantics stay: the sender copied (it may change its tensor at once), and a
segment is the receiver's alone until its tensor is freed. What arrives is what torch's
TensorPipe agent makes of the message's tensors: it sends each *storage* once per
message, whole, and the tensors as views of it (``storage_offset``, sizes, strides, so
memory format too; any dtype), except that a tensor using less than half of a storage of
8 KiB or more is cloned first and sent on a storage of its own (``cloneSparseTensors`` in
torch's ``rpc/utils.cpp``). Here likewise: one segment per storage per message
(``_Message``; pickle's memo makes every view of it one storage on arrival), and a tensor
torch would clone copied alone, with the strides torch's ``clone`` gives it. Only a
storage of at least ``SHARED.min_bytes`` (``MIN_BYTES`` unless the cluster's
``NBRPC_SHARED_TENSORS_MIN_BYTES`` says otherwise) goes this way, from a dense CPU tensor
that does not require grad (distributed autograd attaches its functions to those) and
carries no conjugate or negative bit, in a cluster whose every member runs on this host
(the driver turns it on for local clusters and tells their workers, ``enable``;
``NBRPC_SHARED_TENSORS=0`` in the driver's environment turns it off). Everything else
takes torch's path.

Headers: byte 0 is the segment's state (free, sent, adopted, closed), bytes 8-16 the
adopting process's pid, bytes 16-24 the segment's token (a receiver checks it, so a
reused descriptor number is never mistaken for an old segment), bytes 24-32 the number
of the message that last used it. A receiver killed while it held a segment leaves it
adopted: the sender takes it back once that pid is gone. A message no one unpickles
(the reply to a call whose caller gave up on it: torch drops a late reply unread)
leaves its segment sent: the sender takes it back ``SENT_LEASE`` seconds after it sent
it, and a receiver that would adopt it after that finds another message's number there
and raises, never reading another message's tensor. A sender that ends leaves its
receivers' tensors valid (they map the memory).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import struct
import threading
import time
import weakref

import torch

from .._util import pid_alive

MIN_BYTES = 1 << 20
HEADER = 4096  # the data starts page-aligned
ROUND = 2 << 20  # segment sizes are multiples of this, so similar tensors share them
POOL_LIMIT = 4 << 30  # bytes of segments a member keeps at most; past it, torch's path
UNUSED_FOR = 60.0  # seconds a free segment stays after its last use (checked at the next send)
SENT_LEASE = 600.0  # seconds after which a segment sent and never adopted is taken back
FREE, SENT, ADOPTED, CLOSED = 0, 1, 2, 3
# torch clones a tensor that uses less than 1/CLONE_MULTIPLE of a storage of CLONE_MIN bytes
# or more before sending it (``cloneSparseTensors``, torch/csrc/distributed/rpc/utils.cpp)
CLONE_MIN, CLONE_MULTIPLE = 8 << 10, 2


_MADV_POPULATE_WRITE = 23  # Linux 5.14; Python's mmap module names it from 3.13


def mapped(fd: int, length: int) -> mmap.mmap:
    """The shared memory ``fd`` mapped and faulted in now, in one go, not on the first copy;
    in huge pages where the system gives shared memory those (``shmem_enabled`` in
    ``/sys/kernel/mm/transparent_hugepage`` set to ``advise``, ``within_size`` or ``always``;
    ``never`` is a common default). There, a 100 MiB copy in or out of a segment took
    7.7 ms on one thread, against 10.3 ms through 4 KiB pages."""
    mm = mmap.mmap(fd, length, flags=mmap.MAP_SHARED)
    try:
        mm.madvise(mmap.MADV_HUGEPAGE)  # asked before the first fault: pages are sized then
        mm.madvise(_MADV_POPULATE_WRITE)
    except OSError:  # a kernel without either: fault it in as the mapping is made
        mm.close()
        mm = mmap.mmap(fd, length, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
    return mm


class _Segment:
    """One shared memory segment of the sender's pool, mapped and faulted in."""

    __slots__ = ("fd", "mm", "size", "token", "data", "used", "message")

    def __init__(self, size: int):
        self.fd = os.memfd_create("nbrpc-tensors", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, HEADER + size)
            self.mm = mapped(self.fd, HEADER + size)
        except BaseException:
            os.close(self.fd)
            raise
        self.size, self.token = size, secrets.randbits(63)
        struct.pack_into("Bxxxxxxxqq", self.mm, 0, FREE, 0, self.token)
        self.data = torch.frombuffer(self.mm, dtype=torch.uint8, offset=HEADER)
        self.used = time.monotonic()
        self.message = 0  # the number of the last message sent through it

    def state(self) -> int:
        return self.mm[0]

    def close(self) -> None:
        self.mm[0] = CLOSED  # receivers drop their mappings of it
        del self.data
        os.close(self.fd)
        try:
            self.mm.close()
        except BufferError:  # a tensor over it is still alive here: unmapped with it
            pass


class Pool:
    """The segments this member sends from."""

    def __init__(self):
        self.lock = threading.Lock()
        self.segments: list[_Segment] = []

    def take(self, nbytes: int) -> _Segment | None:
        """A free segment that fits ``nbytes`` (not more than twice over), marked sent;
        None when the pool is full."""
        with self.lock:
            now = time.monotonic()
            fits = None
            for seg in self.segments:
                state = seg.state()
                if state == ADOPTED and not pid_alive(struct.unpack_from("q", seg.mm, 8)[0]):
                    seg.mm[0] = FREE  # its receiver was killed holding it
                elif state == SENT and now - seg.used > SENT_LEASE:
                    seg.mm[0] = FREE  # its message was dropped unread
                if fits is None and seg.state() == FREE and nbytes <= seg.size <= 2 * nbytes + ROUND:
                    fits = seg
            for seg in [s for s in self.segments if s is not fits and s.state() == FREE
                        and now - s.used > UNUSED_FOR]:
                self.segments.remove(seg)
                seg.close()
            if fits is None:
                size = -(-nbytes // ROUND) * ROUND
                if sum(s.size for s in self.segments) + size > POOL_LIMIT:
                    return None
                fits = _Segment(size)
                self.segments.append(fits)
            fits.message += 1
            struct.pack_into("q", fits.mm, 24, fits.message)
            fits.mm[0], fits.used = SENT, now
            return fits

    def close(self) -> None:
        """Give every segment back (a receiver's tensor keeps its own mapping)."""
        with self.lock:
            for seg in self.segments:
                seg.close()
            self.segments.clear()


class SharedTensors:
    """Whether this member sends big tensors through shared memory, its pool, and the
    segments of other members it has mapped (by pid, descriptor and token)."""

    def __init__(self):
        self.enabled = False
        self.min_bytes = MIN_BYTES  # the smallest storage sent this way
        self.pool = Pool()
        self.lock = threading.Lock()
        self.mapped: dict[tuple[int, int, int], mmap.mmap] = {}

    def mapping(self, pid: int, fd: int, token: int, size: int) -> mmap.mmap:
        key = (pid, fd, token)
        with self.lock:
            mm = self.mapped.get(key)
            if mm is None:
                for old in [k for k, m in self.mapped.items() if m[0] == CLOSED or not pid_alive(k[0])]:
                    del self.mapped[old]
                opened = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
                try:
                    mm = mapped(opened, HEADER + size)
                finally:
                    os.close(opened)
                if struct.unpack_from("q", mm, 16)[0] != token:
                    mm.close()
                    raise RuntimeError(f"process {pid}'s shared tensor segment was closed before it arrived")
                self.mapped[key] = mm
            return mm

    def forget(self) -> None:
        """The cluster ended: no more sending this way, every segment given back."""
        self.enabled = False
        self.pool.close()
        with self.lock:
            self.mapped.clear()


SHARED = SharedTensors()


class _Message:
    """The segments taken for one message, and its storages sent through them (by address
    and size), each one ``_SentStorage`` however many of the message's tensors view it."""

    __slots__ = ("taken", "storages")

    def __init__(self):
        self.taken: list[_Segment] = []
        self.storages: dict[tuple[int, int], _SentStorage | object] = {}


class _Messages(threading.local):
    """The messages this thread is pickling, innermost last (one may be pickled inside another)."""

    def __init__(self):
        self.stack: list[_Message] = []


_messages = _Messages()


class _Pickling:
    """Around the pickling of one message: if it fails, the segments it took are free
    again (the message never leaves). A class, not a generator: it runs for every message."""

    def __enter__(self) -> None:
        _messages.stack.append(_Message())

    def __exit__(self, kind, error, traceback) -> None:
        message = _messages.stack.pop()
        if kind is not None:
            for seg in message.taken:
                seg.mm[0] = FREE


PICKLING = _Pickling()  # ``with PICKLING:`` around each message's pickling


def enable(on: bool, min_bytes: int | None = None) -> None:
    """Send storages of ``min_bytes`` or more (``MIN_BYTES`` if None) through shared memory
    (only where every member runs on this host), or stop, giving every segment back."""
    if not on and SHARED.enabled:
        SHARED.forget()
    SHARED.min_bytes = MIN_BYTES if min_bytes is None else max(1, int(min_bytes))
    SHARED.enabled = on


def is_enabled() -> bool:
    return SHARED.enabled


def eligible(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is one whose storage can go through a segment: dense, on the CPU,
    plain bits (torch's path keeps what autograd, quantization and the conjugate and
    negative bits add)."""
    return (tensor.layout is torch.strided and tensor.device.type == "cpu" and not tensor.requires_grad
            and not tensor.is_nested and not tensor.is_quantized and not tensor.is_conj() and not tensor.is_neg())


def cloned_by_torch(tensor: torch.Tensor, storage_bytes: int) -> bool:
    """Whether torch sends ``tensor`` as a clone on a storage of its own (it uses so little
    of its storage that sending the whole would waste the wire)."""
    return storage_bytes >= CLONE_MIN and storage_bytes >= CLONE_MULTIPLE * tensor.element_size() * tensor.numel()


class _SentStorage:
    """A storage of the message being pickled, copied into a segment: pickled once, as the
    receiver's ``adopt``, then by pickle's memo wherever another tensor views it. Its dtype
    is the first such tensor's: torch's pickler keeps one per storage, so a view in another
    dtype arrives in that one, its sizes, strides and offset read in it."""

    __slots__ = ("handle", "dtype")

    def __init__(self, handle: tuple, dtype: torch.dtype):
        self.handle, self.dtype = handle, dtype

    def __reduce__(self):
        return adopt, self.handle


def reducer(fallback):
    """The pickler's reducer for ``torch.Tensor``: tensors whose storage torch would send
    with at least ``SHARED.min_bytes`` as views of a segment, the rest through ``fallback``
    (torch's own)."""

    def reduce(tensor):
        if not SHARED.enabled or below_shared(tensor):
            return fallback(tensor)
        if not eligible(tensor):
            _leave_to_torch(tensor)
            return fallback(tensor)
        storage = tensor.untyped_storage()
        nbytes = storage.nbytes()
        if cloned_by_torch(tensor, nbytes):
            return _reduce_clone(tensor, fallback)
        if nbytes < SHARED.min_bytes:
            return fallback(tensor)
        message = _messages.stack[-1] if _messages.stack else _Message()
        key = (storage.data_ptr(), nbytes)
        sent = message.storages.get(key)
        if sent is TORCHS:  # a view of it that requires grad went first: torch sends the storage
            return fallback(tensor)
        if sent is None:
            seg = _take(nbytes, message)
            if seg is None:
                return fallback(tensor)
            COPIER.copy(seg.data.data_ptr(), storage.data_ptr(), nbytes)
            sent = message.storages[key] = _SentStorage(_handle(seg, nbytes), tensor.dtype)
        return rebuild, (sent, sent.dtype, tensor.storage_offset(), tuple(tensor.shape), tensor.stride())

    return reduce


TORCHS = object()  # in ``_Message.storages``: a storage torch's path sends


def below_shared(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s storage is smaller than ``SHARED.min_bytes``: then torch's path
    sends it whatever else holds (a clone of part of it is smaller still), and the usual
    small tensor is spared ``eligible``'s checks, which cost several times torch's reducer."""
    try:
        return tensor.untyped_storage().nbytes() < SHARED.min_bytes
    except (RuntimeError, NotImplementedError):  # no storage (sparse): the checks below decide
        return False


def _leave_to_torch(tensor: torch.Tensor) -> None:
    """A dense CPU tensor taking torch's path (it requires grad, say): its storage goes that
    way for the rest of the message too, so that the views of it there stay views of it."""
    if tensor.layout is torch.strided and tensor.device.type == "cpu" and not tensor.is_nested and _messages.stack:
        storage = tensor.untyped_storage()
        nbytes = storage.nbytes()
        if nbytes >= SHARED.min_bytes and not cloned_by_torch(tensor, nbytes):
            _messages.stack[-1].storages.setdefault((storage.data_ptr(), nbytes), TORCHS)


def _reduce_clone(tensor: torch.Tensor, fallback):
    """A tensor torch clones before sending: copied alone into a segment, laid out as
    torch's ``clone`` lays it out (its strides where they are dense, else contiguous)."""
    nbytes = tensor.element_size() * tensor.numel()
    if nbytes < SHARED.min_bytes:
        return fallback(tensor)
    message = _messages.stack[-1] if _messages.stack else _Message()
    seg = _take(nbytes, message)
    if seg is None:
        return fallback(tensor)
    stride = torch.empty_like(tensor, device="meta").stride()  # what clone's preserve_format gives
    rebuild(seg.data.untyped_storage(), tensor.dtype, 0, tuple(tensor.shape), stride).copy_(tensor)
    return rebuild, (_SentStorage(_handle(seg, nbytes), tensor.dtype), tensor.dtype, 0, tuple(tensor.shape), stride)


def _take(nbytes: int, message: _Message) -> _Segment | None:
    """A segment for ``nbytes`` of ``message``; None: torch's path (no memfd, no memory, pool full)."""
    try:
        seg = SHARED.pool.take(nbytes)
    except OSError:
        return None
    if seg is not None:
        message.taken.append(seg)
    return seg


def _handle(seg: _Segment, nbytes: int) -> tuple:
    return os.getpid(), seg.fd, seg.token, seg.size, nbytes, seg.message  # ``adopt``'s arguments


class Copier:
    """Copies a tensor into a segment in two halves with ``memmove`` (which runs without the
    GIL), one on the sending thread and one on a helper thread of its own. torch's
    ``copy_`` is as fast alone, but its OpenMP threads spin for milliseconds after it: on
    a small machine they took a core from the receiver's copy of the reply (a 100 MiB
    echo's second copy took 5 to 16 ms). The helper waits on a lock when idle: no CPU at
    rest."""

    SPLIT_MIN = 8 << 20  # smaller copies take one memmove on the sending thread

    def __init__(self):
        self.lock = threading.Lock()  # one copy at a time has the helper
        self.start, self.finished = threading.Lock(), threading.Lock()
        self.job: tuple = ()
        self.helper: threading.Thread | None = None

    def copy(self, target: int, source: int, nbytes: int) -> None:
        if nbytes < self.SPLIT_MIN or not self.lock.acquire(blocking=False):
            ctypes.memmove(target, source, nbytes)
            return
        try:
            if self.helper is None:
                self.start.acquire()
                self.finished.acquire()
                self.helper = threading.Thread(target=self._serve, name="nbrpc-copy", daemon=True)
                self.helper.start()
            half = nbytes // 2
            self.job = (target + half, source + half, nbytes - half)
            self.start.release()
            ctypes.memmove(target, source, half)
            self.finished.acquire()
        finally:
            self.lock.release()

    def _serve(self) -> None:
        while True:
            self.start.acquire()
            ctypes.memmove(*self.job)
            self.finished.release()

    def reset(self) -> None:
        """After a fork: the parent's helper is not in the child."""
        self.__init__()


COPIER = Copier()
os.register_at_fork(after_in_child=COPIER.reset)


def adopt(pid: int, fd: int, token: int, size: int, nbytes: int, message: int) -> torch.UntypedStorage:
    """On the receiver: the sent storage, in the sender's segment, this process's until
    freed (the last tensor over it)."""
    mm = SHARED.mapping(pid, fd, token, size)
    _check_message(mm, pid, message)
    struct.pack_into("q", mm, 8, os.getpid())
    mm[0] = ADOPTED
    _check_message(mm, pid, message)  # not taken back as it was adopted
    memory = memoryview(mm)[HEADER:HEADER + nbytes]
    weakref.finalize(memory, _release, mm)
    return torch.frombuffer(memory, dtype=torch.uint8).untyped_storage()


def rebuild(storage: torch.UntypedStorage, dtype: torch.dtype, offset: int, shape: tuple,
         stride: tuple) -> torch.Tensor:
    """On the receiver: a tensor of the message, viewing one of its storages as the sender's did."""
    return torch.empty(0, dtype=dtype).set_(storage, offset, shape, stride)


def _check_message(mm: mmap.mmap, pid: int, message: int) -> None:
    if struct.unpack_from("q", mm, 24)[0] != message:
        raise RuntimeError(f"a tensor process {pid} sent through shared memory arrived more than "
                           f"{SENT_LEASE:g} s after it was sent, and its memory was used again")


def _release(mm: mmap.mmap) -> None:
    """The receiver's tensor (its last view) is gone: the sender may use the segment again."""
    if mm[0] == ADOPTED:  # not one its sender has closed
        mm[0] = FREE

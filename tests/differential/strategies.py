"""Hypothesis strategies for the differential check's scenarios (plain data, see
``messages``): bases of every dtype with sizes on both sides of each threshold a path
takes a tensor by, views of them that share, overlap, offset and stride, nested in
containers beside plain values, sent by each call form to each kind of callable."""

from __future__ import annotations

from hypothesis import strategies as st

from nbrpc.wire import shared_tensors

ELEMENT_SIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "complex64": 8,
                "int64": 8, "int32": 4, "uint8": 1, "bool": 1}
GRAD_DTYPES = {"float32", "float64", "float16", "bfloat16", "complex64"}
# Bytes where a tensor's path changes: torch sends a view of a storage of 8 KiB or more
# that uses less than half of it as a copy of its own (rpc/utils.cpp ``cloneSparseTensors``);
# nbrpc sends a tensor of MIN_BYTES or more through shared memory.
THRESHOLDS = (8 << 10, shared_tensors.MIN_BYTES)

KINDS = ("function", "pick", "async", "method", "builtin", "script", "async_script")
FORMS = {"method": ("rpc_sync", "rpc_async", "remote")}  # an RRef's proxies
CALL_FORMS = ("rpc_sync", "rpc_async", "remote", "then")
PLAIN = st.one_of(st.none(), st.booleans(), st.integers(-(2 ** 63), 2 ** 63 - 1),
                  st.floats(allow_nan=False), st.text(max_size=6))


@st.composite
def bases(draw, big_only: bool = False) -> dict:
    """A base tensor's spec; ``big_only``: only sizes around the shared-memory threshold."""
    dtype = draw(st.sampled_from(sorted(ELEMENT_SIZE)))
    size = ELEMENT_SIZE[dtype]
    small, big = ({max(0, limit // size + d) for d in (-1, 0, 1)} for limit in THRESHOLDS)
    big = st.sampled_from(sorted(big | {2 * THRESHOLDS[1] // size + 5}))
    n = draw(big if big_only else st.one_of(big, st.integers(0, 48), st.sampled_from(sorted(small))))
    grad = dtype in GRAD_DTYPES and draw(st.integers(0, 4)) == 0
    return {"dtype": dtype, "n": n, "seed": draw(st.integers(0, 1 << 16)), "grad": grad}


@st.composite
def most_of(draw, n: int) -> list:
    """A view over at least half of a base of ``n`` elements (torch sends such a view with
    its storage, shared with the message's other views of it)."""
    kind = draw(st.sampled_from(["slice", "whole", "matrix_t", "channels_last"]))
    if kind == "slice":
        start, stop = draw(st.integers(0, n // 4)), draw(st.integers(n - n // 4, n))
        return [kind, start, stop, draw(st.sampled_from([1, 1, 2]))]
    if kind == "matrix_t":
        rows = draw(st.integers(2, 64))
        return [kind, rows, n // rows]
    if kind == "channels_last":
        c, h = draw(st.integers(1, 4)), draw(st.integers(1, 4))
        return [kind, c, h, n // (c * h)]
    return [kind]


@st.composite
def views(draw, n: int) -> list:
    kind = draw(st.sampled_from(["whole", "whole", "slice", "slice", "element", "expand", "windows", "matrix_t",
                                 "channels_last"] if n else ["whole"]))
    if kind == "slice":
        # often from the start or to the end: views of most of a storage, which torch keeps shared
        start = draw(st.just(0) | st.integers(0, n))
        stop = draw(st.just(n) | st.integers(start, n))
        return [kind, start, stop, draw(st.sampled_from([1, 1, 1, 2, 3, 7]))]
    if kind == "element":
        return [kind, draw(st.integers(0, n - 1))]
    if kind == "expand":
        return [kind, draw(st.integers(0, n - 1)), draw(st.integers(0, 6))]
    if kind == "windows":
        size = draw(st.integers(1, min(n, 16)))
        return [kind, size, draw(st.integers(1, size + 2))]
    if kind == "matrix_t":
        rows = draw(st.integers(1, min(n, 64)))
        return [kind, rows, draw(st.integers(1, n // rows))]
    if kind == "channels_last":
        c = draw(st.integers(1, min(n, 4)))
        h = draw(st.integers(1, max(1, min(4, n // c))))
        return [kind, c, h, draw(st.integers(1, max(1, n // (c * h))))]
    return [kind]


def items(leaf_count: int):
    """A message's items: plain values, leaves, and lists, tuples, dicts and boxes of them."""
    leaf = st.integers(0, leaf_count - 1).map(lambda i: ["leaf", i]) if leaf_count else st.nothing()
    keys = st.text(alphabet="abxyz", min_size=1, max_size=2)
    return st.recursive(
        st.one_of(leaf, leaf, PLAIN),
        lambda inner: st.one_of(
            st.lists(inner, max_size=3).map(lambda v: ["list", v]),
            st.lists(inner, max_size=3).map(lambda v: ["tuple", v]),
            st.dictionaries(keys, inner, max_size=3).map(lambda d: ["dict", [[k, v] for k, v in d.items()]]),
            st.tuples(inner, inner).map(lambda v: ["box", list(v)])),
        max_leaves=6)


@st.composite
def scenarios(draw, kind: str, big_only: bool = False) -> dict:
    """One call to a callable of ``kind``: its message, the call form, what the callee
    writes; ``big_only``: every base past the shared-memory threshold and every view over
    most of its base (Hypothesis draws few of these among many small ones)."""
    base_specs = draw(st.lists(bases(big_only), min_size=1, max_size=3))
    leaf_count = draw(st.just(2) | st.integers(1 if kind in ("builtin", "script", "async_script") else 0, 4))
    # mostly views of the first base, so that they share a storage
    chosen = st.sampled_from([0, 0, *range(len(base_specs))])
    view = most_of if big_only else views
    leaves = [{"base": b, "view": draw(view(base_specs[b]["n"]))} for b in (draw(chosen) for _ in range(leaf_count))]
    message = draw(st.lists(items(leaf_count), min_size=1 if kind == "pick" else 0, max_size=4))
    spec = {"kind": kind, "form": draw(st.sampled_from(FORMS.get(kind, CALL_FORMS))),
            "to": "worker1", "next": "worker2", "write": draw(st.integers(-1, leaf_count)),
            "bases": base_specs, "leaves": leaves, "items": message,
            "profiled": draw(st.integers(0, 5)) == 0}
    if kind == "pick" or (kind == "method" and draw(st.booleans())):
        spec["pick"] = draw(st.integers(0, max(0, len(message) - 1)))
    if kind == "builtin":
        spec["op"] = draw(st.sampled_from(["add", "mul"]))
    return spec

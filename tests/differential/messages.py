"""Messages made from plain data, and what a process sees of them, as plain data.

Both sides of the differential check run this code: the raw torch script imports it,
the nbrpc cluster runs it as a notebook cell. So it imports only torch and the standard
library, and everything it takes or gives is JSON (the spec that Hypothesis draws, the
facts that are compared).

- ``make_base``: a 1-D tensor from ``{"dtype", "n", "seed", "grad"}``, the same bytes in
  every process.
- ``make_view``: a view of a base, ``["slice", start, stop, step]``, ``["matrix_t", rows,
  cols]``, ``["windows", size, step]`` (overlapping when step < size), ``["channels_last",
  c, h, w]``, ``["element", i]`` (0-d), ``["expand", i, m]`` (stride 0) or ``["whole"]``.
- ``build``: nested ``["list"|"tuple", [...]]``, ``["dict", [[key, item], ...]]``,
  ``["box", [item, item]]`` (a ``Box``: a class of the notebook's, importable under raw
  torch) and ``["leaf", i]`` items into containers of those views; anything else is a
  plain value.
- ``describe``: a value's structure and, per tensor, dtype, shape, strides, offset, the
  size and identity of its storage (labels in order of appearance: equal labels, one
  storage), ``requires_grad`` and a digest of its values.
- ``write_through``: fill one of the tensors in place, as a function that writes through
  one argument and reads another does; the error's class if torch refuses.
"""

import ctypes
import hashlib

import torch

DTYPES = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "complex64": torch.complex64, "int64": torch.int64,
    "int32": torch.int32, "uint8": torch.uint8, "bool": torch.bool,
}
FILL = 7  # what write_through writes (a value no generated element has in every dtype)


def make_base(base):
    """The 1-D tensor a base spec names; random values from its own seed."""
    dtype, n = DTYPES[base["dtype"]], base["n"]
    generator = torch.Generator().manual_seed(base["seed"])
    if dtype.is_floating_point or dtype.is_complex:
        wide = torch.complex64 if dtype.is_complex else torch.float32
        tensor = torch.randn(n, generator=generator, dtype=wide).to(dtype)
    elif dtype is torch.bool:
        tensor = torch.randint(0, 2, (n,), generator=generator).bool()
    else:
        tensor = torch.randint(0, 100, (n,), generator=generator).to(dtype)
    return tensor.requires_grad_(bool(base.get("grad")))


def make_view(base, view):
    """A view of ``base`` (a 1-D tensor) as ``view`` says."""
    kind, *params = view
    if kind == "whole":
        return base
    if kind == "slice":
        start, stop, step = params
        return base[start:stop:step]
    if kind == "matrix_t":
        rows, cols = params
        return base[:rows * cols].view(rows, cols).t()
    if kind == "windows":
        size, step = params
        return base.unfold(0, size, step)
    if kind == "channels_last":
        c, h, w = params
        return base[:c * h * w].view(1, h, w, c).permute(0, 3, 1, 2)
    if kind == "element":
        return base[params[0]]
    if kind == "expand":
        i, m = params
        return base[i:i + 1].expand(m)
    raise ValueError(f"unknown view {view!r}")


class Box:
    """Two values in an object of a class of the notebook's (of a module under raw torch)."""

    def __init__(self, first, second):
        self.first, self.second = first, second


def build(item, leaves):
    """The value an item spec names, its leaves taken from ``leaves``."""
    if isinstance(item, list):
        tag, body = item
        if tag == "leaf":
            return leaves[body]
        if tag == "box":
            return Box(*(build(value, leaves) for value in body))
        if tag == "dict":
            return {key: build(value, leaves) for key, value in body}
        values = [build(value, leaves) for value in body]
        return tuple(values) if tag == "tuple" else values
    return item


def make_message(spec):
    """The message a scenario spec names: its items (a list) and its leaves."""
    bases = [make_base(base) for base in spec["bases"]]
    leaves = [make_view(bases[leaf["base"]], leaf["view"]) for leaf in spec["leaves"]]
    return [build(item, leaves) for item in spec["items"]], leaves


def tensors_in(value):
    """The tensors in ``value``, in the order ``describe`` meets them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, Box):
        value = [value.first, value.second]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_in(v)]
    return []


def digest(tensor):
    """The tensor's values, bit for bit, as a short hash (and the first few, to read)."""
    dense = tensor.detach().reshape(-1).contiguous()
    nbytes = dense.numel() * dense.element_size()
    raw = ctypes.string_at(dense.data_ptr(), nbytes) if nbytes else b""
    head = [repr(v) for v in dense[:3].tolist()]
    return hashlib.blake2b(raw, digest_size=8).hexdigest() + " " + ",".join(head)


def tensor_facts(tensor, storages):
    storage = tensor.untyped_storage()
    key = storage.data_ptr() if storage.data_ptr() else ("empty", id(storage))
    label = storages.setdefault(key, len(storages))
    return {
        "dtype": str(tensor.dtype).replace("torch.", ""), "shape": list(tensor.shape),
        "stride": list(tensor.stride()), "offset": tensor.storage_offset(),
        "storage": label, "storage_nbytes": storage.nbytes(),
        "requires_grad": tensor.requires_grad, "values": digest(tensor),
    }


def describe(value):
    """``value``'s structure and its tensors' facts (see the module's docstring)."""
    storages, tensors = {}, []

    def walk(v):
        if isinstance(v, torch.Tensor):
            tensors.append(tensor_facts(v, storages))
            return ["tensor", len(tensors) - 1]
        if isinstance(v, dict):
            return ["dict", [[repr(k), walk(x)] for k, x in v.items()]]
        if isinstance(v, (list, tuple)):
            return [type(v).__name__, [walk(x) for x in v]]
        if isinstance(v, Box):
            return ["Box", [walk(v.first), walk(v.second)]]
        if v is None or isinstance(v, (bool, int, float, str)):
            return [type(v).__name__, v]
        return [type(v).__name__, repr(v)]

    return {"value": walk(value), "tensors": tensors}


def write_through(leaves, index):
    """Fill ``leaves[index]`` in place (none when the index is out of range); the class
    of what torch raised, or None."""
    if not 0 <= index < len(leaves):
        return None
    try:
        leaves[index].fill_(FILL)
    except Exception as e:  # compared: both sides must refuse alike
        return type(e).__name__
    return None

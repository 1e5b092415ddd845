"""The first route of ``serialization``: a plain value (None, a bool, a number, a string,
bytes), which the C pickler writes itself, asking no reducer and no dispatch table.

A small call's reply is one: pickled as plain ``pickle`` does, without the kept
pickler's set-up for tensors and RRefs, which cost such a reply about half of its
pickling. The same bytes either way.
"""

from __future__ import annotations

import pickle

import cloudpickle

from . import signing

PLAIN_VALUES = frozenset({type(None), bool, int, float, str, bytes})


def message(obj) -> bytes:
    """``obj``'s message (``obj`` of a ``PLAIN_VALUES`` type), signed and counted."""
    return signing.message(obj, pickle.dumps(obj, cloudpickle.DEFAULT_PROTOCOL), [])

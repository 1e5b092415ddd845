"""The functions the benchmarks call over RPC.

They live in an importable module (not in ``__main__``) so that nbrpc and raw
torch both pickle them by reference: the comparison then measures the RPC layers,
not the cost of shipping a function by value. ``CELL_SOURCE`` is the same code as
``echo`` and ``scaled`` for a driver to define in its ``__main__``, as a notebook cell
does (``nbrpc_driver.py``): a cell's function against the script's importable one.
"""

import math

SCALE = 3


def echo(value):
    """Return ``value``: the smallest useful call, and a round trip for tensors."""
    return value


def chatty(value):
    """Print one line, then return ``value``: a call whose output goes to the driver."""
    print("step", value)
    return value


def helper(x):
    return x + 1


def scaled(x):
    """A function with a few globals: a constant, an imported module, another function."""
    return math.floor(helper(x) * SCALE)


CELL_SOURCE = '''
import math

SCALE = 3


def echo(value):
    return value


def helper(x):
    return x + 1


def scaled(x):
    return math.floor(helper(x) * SCALE)
'''


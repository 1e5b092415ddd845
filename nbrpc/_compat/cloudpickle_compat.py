"""The private parts of cloudpickle that notebook definitions are pickled with.

``wire.definitions`` sends a notebook's functions and classes as cloudpickle would,
but binds them on arrival to each process's own namespace, so it takes cloudpickle's
pieces rather than its whole reduction. cloudpickle is not pinned: each name says what
it is for and the versions it is known to work with (3.0 and 3.1), and
``tests/test_compat.py`` reads every one.
"""

from __future__ import annotations

from cloudpickle import cloudpickle as _cp

# The value in a closure cell (the empty-cell marker for an unset one); known to work with cloudpickle 3.
cell_contents = _cp._get_cell_contents
# The marker cell_contents returns for an empty cell; known to work with cloudpickle 3.
EMPTY_CELL = _cp._empty_cell_value
# A new empty closure cell, filled when the function's state is set; known to work with cloudpickle 3.
make_empty_cell = _cp._make_empty_cell
# The names of globals a code object (and the code nested in it) reads; known to work with cloudpickle 3.
code_globals = _cp._extract_code_globals
# A class's skeleton: (type, name, bases, type kwargs, tracker id, extra); known to work with cloudpickle 3.
class_skeleton = _cp._class_getnewargs
# A class's attributes as cloudpickle sends them, and how to set them on a skeleton;
# known to work with cloudpickle 3.
class_state = _cp._class_getstate
set_class_state = _cp._class_setstate

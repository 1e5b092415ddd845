"""``Reduced``: a reduction the C pickler writes in an object's place (``c_pickling``)."""

from __future__ import annotations


class Reduced(tuple):
    """A reduction (callable, arguments) in the place of the object it rebuilds (a
    notebook function in a call, a held class in its instance's reduction): the C
    pickler's table gives it back as it is (``tuple``), where the C pickler writes any
    function or class as a global before it looks in a table."""

    __slots__ = ()

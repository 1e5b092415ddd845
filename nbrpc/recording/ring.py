"""One member's recorded halves, the oldest dropped first and counted."""

from __future__ import annotations

import collections

CAPACITY = 20_000  # halves kept per member
T = 1  # the slot of a half that holds its time


class Ring:
    """The last ``capacity`` halves of this member (lists whose slot ``T`` is their
    time), and how many were evicted when: ``evicted`` holds ``[time, count]`` per ``BUCKET``
    seconds (bounded too)."""

    BUCKET = 0.01

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self.halves: collections.deque = collections.deque(maxlen=capacity)
        self.evicted: collections.deque = collections.deque(maxlen=capacity)

    def add(self, half: list) -> None:
        if len(self.halves) == self.capacity:
            self._evict()
        self.halves.append(half)

    def _evict(self) -> None:
        t = self.halves[0][T]
        evicted = self.evicted
        if evicted and t - evicted[-1][0] < self.BUCKET:
            evicted[-1][1] += 1
        else:
            evicted.append([t, 1])

    def since(self, start: float | None) -> list[list]:
        return [h for h in list(self.halves) if start is None or h[T] >= start]

    def dropped(self, start: float, end: float) -> int:
        return sum(n for t, n in list(self.evicted) if start <= t <= end)

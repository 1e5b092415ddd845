"""The targets of the benchmark rows, read from ``targets.toml`` beside this file.

``load()`` gives one ``Target`` per row id: the row's label, unit, reference, how its
ratio reads, its bound (if any), which way is better, and why. ``Target.met(row)``
checks a row's values against it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest's own dependency reads the same
    import tomli as tomllib

FILE = Path(__file__).resolve().with_name("targets.toml")
KINDS = ("ratio", "nbrpc", "difference")


@dataclass(frozen=True)
class Target:
    id: str
    what: str
    unit: str
    reason: str
    reference_name: str | None = None
    ratio_of: str = "nbrpc/reference"
    of: str | None = None  # "ratio", "nbrpc" or "difference"; None: no target
    at_most: float | None = None
    at_least: float | None = None
    better: str = "lower"
    gate: str = "ratio"  # or "target": see targets.toml

    def __post_init__(self):
        if self.ratio_of not in ("nbrpc/reference", "reference/nbrpc"):
            raise ValueError(f"{self.id}: ratio must be 'nbrpc/reference' or 'reference/nbrpc', not {self.ratio_of!r}")
        if self.of is not None and self.of not in KINDS:
            raise ValueError(f"{self.id}: target of {self.of!r}; use one of {', '.join(KINDS)}")
        if self.of is not None and (self.at_most is None) == (self.at_least is None):
            raise ValueError(f"{self.id}: a target needs one of at_most and at_least")
        if self.better not in ("lower", "higher", "none"):
            raise ValueError(f"{self.id}: better must be 'lower', 'higher' or 'none', not {self.better!r}")
        if self.gate not in ("ratio", "target"):
            raise ValueError(f"{self.id}: gate must be 'ratio' or 'target', not {self.gate!r}")

    def text(self) -> str | None:
        """The target as the table shows it, e.g. ``ratio <= 1.05``."""
        if self.of is None:
            return None
        sense, bound = ("<=", self.at_most) if self.at_most is not None else (">=", self.at_least)
        return f"{self.of} {sense} {bound:g}"

    def ratio(self, nbrpc: float | None, reference: float | None) -> float | None:
        if nbrpc is None or reference is None:
            return None
        top, bottom = (nbrpc, reference) if self.ratio_of == "nbrpc/reference" else (reference, nbrpc)
        return top / bottom if bottom else None

    def met(self, nbrpc: float | None, reference: float | None, ratio: float | None) -> bool | None:
        """Whether the values meet the target; None without a target or a value to judge."""
        if self.of is None:
            return None
        value = {"ratio": ratio, "nbrpc": nbrpc,
                 "difference": None if nbrpc is None or reference is None else nbrpc - reference}[self.of]
        if value is None:
            return None
        return value <= self.at_most if self.at_most is not None else value >= self.at_least


def load(path: Path = FILE) -> dict[str, Target]:
    """Every row's target by id."""
    with open(path, "rb") as f:
        table = tomllib.load(f)
    return {key: _target(key, entry) for key, entry in table.items()}


def _target(key: str, entry: dict) -> Target:
    entry = dict(entry)
    bound = entry.pop("target", None) or {}
    unknown = set(entry) - {"what", "unit", "reason", "reference_name", "ratio", "better", "gate"}
    if unknown or set(bound) - {"of", "at_most", "at_least"}:
        raise ValueError(f"{key}: unknown keys {sorted(unknown | (set(bound) - {'of', 'at_most', 'at_least'}))}")
    better = entry.pop("better", "higher" if "at_least" in bound else "lower")
    return Target(id=key, what=entry["what"], unit=entry["unit"], reason=entry["reason"],
                  reference_name=entry.get("reference_name"), ratio_of=entry.get("ratio", "nbrpc/reference"),
                  of=bound.get("of"), at_most=bound.get("at_most"), at_least=bound.get("at_least"),
                  better=better, gate=entry.get("gate", "ratio"))

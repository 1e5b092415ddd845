"""Comparing the two sides' facts: exact, except an error (nbrpc's must be an instance of
torch's class and keep the words of torch's message) and a time (within a tolerance)."""

from __future__ import annotations

import json
import re

TIME_TOLERANCE = 0.15  # seconds: a timeout fires at its time on both sides
# Words of torch's messages that name this run, not the failure (ids, addresses, times).
_RUN_WORDS = re.compile(r"\b\w+(?:Error|Exception): |WorkerInfo\(.*?\)|name:\w+,rank:\d+|#\d+|0x[0-9a-f]+"
                        r"|line \d+|\"[^\"]*\"|'/[^']*'")

# A frame of nbrpc's own code in a text the user reads (torch's "At:" lists, tracebacks).
_OWN_FRAME = re.compile(r"[\w/.-]*/nbrpc/[\w/]+\.py\b")


def key_words(message: str) -> list[str]:
    """The words that say what failed in the first line of torch's message that has any
    (the class names torch puts before an inner error's text left out)."""
    for line in message.splitlines():
        words = re.findall(r"[A-Za-z_]{3,}", _RUN_WORDS.sub(" ", line))
        if len(words) >= 2:
            return words
    return []


def error_differences(raw: dict, nb: dict, timed: bool) -> list[str]:
    found = []
    if raw["error"] not in nb["bases"] and raw["error"] != nb["error"]:
        found.append(f"error class: raw torch raised {raw['error']}, nbrpc {nb['error']} "
                     f"(bases {nb['bases']}), which `except {raw['error']}:` does not catch")
    missing = [w for w in key_words(raw["message"]) if w not in nb["message"]]
    if missing:
        found.append(f"error text: nbrpc's lacks torch's words {missing}")
    own = sorted(set(_OWN_FRAME.findall(nb["message"])))
    if own:
        found.append(f"error text: nbrpc's holds nbrpc's own frames {own}")
    if timed and abs(raw["seconds"] - nb["seconds"]) > TIME_TOLERANCE:
        found.append(f"time: raw torch raised after {raw['seconds']} s, nbrpc after {nb['seconds']} s")
    return found


def differences(raw, nb, path: str = "", timed: bool = False) -> list[str]:
    """Where ``nb`` (nbrpc's facts) differs from ``raw`` (raw torch's), one line each."""
    if isinstance(raw, dict) and "error" in raw and "bases" in raw:
        if not (isinstance(nb, dict) and "error" in nb):
            return [f"{path or 'outcome'}: raw torch raised {raw['error']}: {raw['message'][:300]}, "
                    f"nbrpc gave {json.dumps(nb)[:300]}"]
        return [f"{path or 'outcome'}: {line}" for line in error_differences(raw, nb, timed)]
    if isinstance(nb, dict) and "error" in nb and "bases" in nb:
        return [f"{path or 'outcome'}: nbrpc raised {nb['error']}: {nb['message'][:300]}, "
                f"raw torch gave {json.dumps(raw)[:300]}"]
    if isinstance(raw, dict) and isinstance(nb, dict) and raw.keys() == nb.keys():
        return [d for key in raw for d in differences(raw[key], nb[key], f"{path}.{key}", timed)]
    if isinstance(raw, list) and isinstance(nb, list) and len(raw) == len(nb):
        return [d for i, (a, b) in enumerate(zip(raw, nb)) for d in differences(a, b, f"{path}[{i}]", timed)]
    return [] if raw == nb else [f"{path}: raw torch {json.dumps(raw)[:300]}, nbrpc {json.dumps(nb)[:300]}"]


def report(request: dict, raw, nb, timed: bool = False) -> str | None:
    """None when the facts agree; else the request, what differs, and both sides' facts."""
    found = differences(raw, nb, timed=timed)
    if not found:
        return None
    return "\n".join(["nbrpc differs from raw torch on", json.dumps(request), *found,
                      "raw torch: " + json.dumps(raw)[:3000], "nbrpc:     " + json.dumps(nb)[:3000]])

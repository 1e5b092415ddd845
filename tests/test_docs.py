"""The documentation is true.

- Every ```python block of the user guide (``docs/guide/*.md``), of the getting-started page
  and of the README runs, in order, page by page, in a real notebook kernel with a real
  cluster. Each page starts in a fresh kernel that has run ``PREAMBLE`` (the guide's index
  says so). Comments on the line before a block, in the page's Markdown:

  - ``<!-- no-test: why -->``: the block cannot run here (another machine, a GPU, Slurm,
    a configuration file); the reason is required;
  - ``<!-- raises: ErrorName -->``: the block must raise that error (a hang staged on
    purpose ends at its timeout).

  ``<!-- test-setup: CODE -->`` anywhere on a page runs CODE first (the cluster a page's
  text assumes, e.g. ``%rpc_init -n 2``).
- The pages made from the code (``docs/_ext/nbrpc_docs.py``) say what the code says: every
  magic and each of its arguments, every environment variable, every benchmark row; the
  labs as a student gets them, without solutions or hidden tests (that a lab page is what
  ``nbgrader generate_assignment`` releases: ``test_nbgrader.py``, beside its course).
- The README is a front door: at most 200 lines, its picture and links exist.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from conftest import execute

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
GUIDE = DOCS / "guide"
sys.path.insert(0, str(DOCS / "_ext"))

import nbrpc_docs  # noqa: E402

PREAMBLE = "%load_ext nbrpc\nimport nbrpc\nimport torch\nimport torch.distributed.rpc as rpc"
NO_TEST = re.compile(r"<!--\s*no-test:(.*?)-->")
RAISES = re.compile(r"<!--\s*raises:\s*(\w+)\s*-->")
SETUP = re.compile(r"<!--\s*test-setup:(.*?)-->", re.S)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def blocks(path: Path) -> list[dict]:
    """The page's ```python blocks: line, code, and the comment on the line before."""
    lines = path.read_text().split("\n")
    found, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            i += 1
            code = []
            while i < len(lines) and lines[i].strip() != "```":
                code.append(lines[i])
                i += 1
            before = lines[start - 1] if start else ""
            no_test, raises = NO_TEST.search(before), RAISES.search(before)
            found.append({"line": start + 1, "code": "\n".join(code),
                          "no_test": no_test.group(1).strip() if no_test else None,
                          "raises": raises.group(1) if raises else None})
        i += 1
    return found


# The user guide, the getting-started page and the README's quick start.
PAGES = sorted(p for p in GUIDE.glob("*.md") if p.name != "index.md") + [DOCS / "getting-started.md",
                                                                         REPO / "README.md"]
RUNNABLE = [str(p.relative_to(REPO)) for p in PAGES if any(b["no_test"] is None for b in blocks(p))]


def test_every_guide_block_runs_or_says_why():
    assert PAGES, "no user guide pages under docs/guide"
    for page in PAGES:
        for block in blocks(page):
            where = f"{page.relative_to(REPO)}:{block['line']}"
            if block["no_test"] is not None:
                assert len(block["no_test"]) >= 10, f"{where}: a no-test comment says why the block cannot run"
    assert RUNNABLE, "no runnable block in the user guide"


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNNABLE)
def test_guide_page_runs(name, kernel):
    """The page's blocks, in order, in a fresh kernel that starts real clusters."""
    _, client = kernel
    page = REPO / name
    setups = [s.strip() for s in SETUP.findall(page.read_text())]
    for code, where in [(PREAMBLE, "the preamble")] + [(s, "its test-setup") for s in setups]:
        _, reply = execute(client, code, timeout=240)
        assert reply["status"] == "ok", f"{name}: {where} failed: {reply.get('ename')}: {reply.get('evalue')}"
    for block in blocks(page):
        if block["no_test"] is not None:
            continue
        where = f"{name}:{block['line']}"
        _, reply = execute(client, block["code"], timeout=240)
        if block["raises"]:
            assert reply["status"] == "error" and reply["ename"] == block["raises"], (
                f"{where}: the block should raise {block['raises']}, got {reply['status']} {reply.get('ename')}")
        elif reply["status"] != "ok":
            trace = ANSI.sub("", "\n".join(reply.get("traceback", [])))
            pytest.fail(f"{where}: the block raised {reply['ename']}: {reply['evalue']}\n{block['code']}\n{trace}",
                        pytrace=False)
    execute(client, "nbrpc.current() and nbrpc.current().shutdown()", timeout=120)


# ---------------------------------------------------------------- generated pages


def test_magics_page_has_every_magic_and_argument():
    from nbrpc.kernel_ext.magics import RpcMagics

    text = nbrpc_docs.magics()
    for kind, prefix in (("line", "%"), ("cell", "%%")):
        for name, method in RpcMagics.magics[kind].items():
            assert f"`{prefix}{name}`" in text, f"{prefix}{name} is missing from the magics page"
            parser = getattr(getattr(RpcMagics, method), "parser", None)
            for action in parser._actions if parser else ():
                for flag in action.option_strings:
                    if flag not in ("-h", "--help"):
                        assert f"`{flag}" in text or f", {flag}" in text, f"{prefix}{name} {flag} is missing"
    assert "--slurm" in text and "--attach" in text  # the launchers' own flags


def test_settings_page_names_every_variable():
    module = nbrpc_docs.settings_module()
    text = nbrpc_docs.settings()
    source = Path(module.__file__).read_text()
    named = set(re.findall(r'"(NBRPC_[A-Z_]+)"', source))
    assert named, "the settings module names no NBRPC_ variable"
    for variable in named:
        assert f"`{variable}`" in text, f"{variable} is missing from the settings page"
    for field in ("name", "threads", "timeout", "transport"):
        assert f"| `{field}` |" in text
    # each variable with what is said of it, not of another
    said = {variable: what for variable, _, what in nbrpc_docs._variables(source)}
    assert said["NBRPC_RANK"] == "Set by the driver in each worker's environment (``WorkerSettings.to_env``)."
    assert said["NBRPC_CLOCK_SKEW"].endswith("which then reads as another machine's (see ``recording.clocks``).")
    assert "warm template off" in said["NBRPC_WARM_START"]  # the "Set by" comment of its group


def test_performance_page_from_results(tmp_path):
    results = REPO / "benchmarks" / "results.json"
    if results.exists():
        text = nbrpc_docs.performance(results)
        for row in json.loads(results.read_text())["rows"]:
            assert nbrpc_docs._cell(row["what"]) in text
    missing = nbrpc_docs.performance(tmp_path / "results.json")
    assert "No benchmark results are stored" in missing
    made = tmp_path / "results.json"
    made.write_text(json.dumps({"machine": {"cpus": 2}, "torch": "2.13.0", "date": "2026-01-01", "spread": 1.03,
                                "rows": [{"what": "a row", "unit": "ms", "nbrpc": 1.5, "reference": 1.0,
                                          "reference_name": "raw", "ratio": 1.5, "target": "<= 1.05",
                                          "met": False, "reason": "why not"}]}))
    text = nbrpc_docs.performance(made)
    assert "| a row | ms | 1.5 | 1 (raw) | 1.5 | <= 1.05 | **no** | why not |" in text
    assert "0 of 1 targets met" in text and "1.03" in text


def test_labs_as_students_get_them():
    source = REPO / "tutorials" / "labs" / "source"
    labs = sorted(p for p in source.iterdir() if p.is_dir())
    assert labs
    for lab in labs:
        for path in lab.glob("*.ipynb"):
            original = json.loads(path.read_text())
            student = nbrpc_docs.student_version(original)
            assert len(student["cells"]) == len(original["cells"])
            text = json.dumps(student)
            for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
                assert marker not in text, f"{path.name}: {marker} in the student's version"
            for before, after in zip(original["cells"], student["cells"]):
                src = "".join(before["source"])
                hidden = re.findall(r"### BEGIN (SOLUTION|HIDDEN TESTS)\n(.*?)### END \1", src, re.S)
                kept = {line.strip() for line in after["source"].split("\n")}
                for _, body in hidden:
                    for line in body.strip().split("\n"):
                        if len(line.strip()) > 12:  # a line of the solution or hidden tests, not a bare `return`
                            assert line.strip() not in kept, f"{path.name}: {line.strip()!r} leaked"
                if after["cell_type"] == "code":
                    assert after["outputs"] == [] and after["execution_count"] is None
            assert "raise NotImplementedError()" in text


def test_student_version_as_nbgrader_writes_it():
    cell = {"cell_type": "code", "metadata": {"nbgrader": {"solution": True, "grade": False}},
            "source": "def f(x):\n    # TODO\n    ### BEGIN SOLUTION\n    return x\n    ### END SOLUTION\n",
            "outputs": [{"output_type": "stream", "name": "stdout", "text": "x"}], "execution_count": 3}
    test = {"cell_type": "code", "metadata": {"nbgrader": {"grade": True}}, "outputs": [], "execution_count": 4,
            "source": "check(f)\n### BEGIN HIDDEN TESTS\nassert f(2) == 2\n### END HIDDEN TESTS\n"}
    student = nbrpc_docs.student_version({"cells": [cell, test], "metadata": {}})
    assert student["cells"][0]["source"] == (
        "def f(x):\n    # TODO\n    # YOUR CODE HERE\n    raise NotImplementedError()\n")
    assert student["cells"][0]["outputs"] == [] and student["cells"][0]["execution_count"] is None
    assert student["cells"][1]["source"] == "check(f)"


# ---------------------------------------------------------------- the README


def test_readme_is_a_front_door():
    readme = (REPO / "README.md").read_text()
    assert len(readme.split("\n")) <= 200
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    assert pictures and all((REPO / p).exists() for p in pictures), pictures
    for link in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if "://" not in link:
            assert (REPO / link).exists(), f"the README links to {link}, which does not exist"
    for command in ("pip install", "make demo", "make test"):
        assert command in readme

"""The pages of the site that are made from the repository at build time.

Parts, each writing under ``docs/generated/`` (not in git) before Sphinx reads its sources:

- ``tutorials``: a link per notebook of ``tutorials/`` (the pages show their stored outputs);
- ``labs``: each lab of ``tutorials/labs/source/`` as its student sees it: solutions and
  hidden tests taken out as ``nbgrader generate_assignment`` does, outputs cleared;
- ``magics``: every magic of ``%load_ext nbrpc`` from its own ``@magic_arguments`` parser;
- ``api`` and ``errors``: autodoc for every name of ``nbrpc.__all__``, the error classes of
  ``nbrpc.errors`` on a page of their own;
- ``settings``: the ``NBRPC_*`` environment variables and ``WorkerSettings``' fields, read
  from the module that defines ``WorkerSettings`` (found by search, wherever it lives);
- ``performance``: the table of ``benchmarks/results.json`` (``make bench``), or a line
  saying that no results are stored.

A file is rewritten only when its text changes, so an unchanged page is not rebuilt.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
import json
import os
import re
import textwrap
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1]
REPO = DOCS.parent
OUT = DOCS / "generated"

# ---------------------------------------------------------------- writing


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.is_symlink() or path.read_text() != text:
        if path.is_symlink():
            path.unlink()
        path.write_text(text)


def _link(path: Path, target: Path) -> None:
    """``path`` as a relative symbolic link to ``target`` (the file is not copied)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    relative = os.path.relpath(target, path.parent)
    if path.is_symlink() and os.readlink(path) == relative:
        return
    if path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(relative)


def _prune(folder: Path, keep: set[Path]) -> None:
    """Remove what an earlier build made in ``folder`` and this one did not."""
    if folder.is_dir():
        for path in folder.iterdir():
            if path not in keep and (path.is_file() or path.is_symlink()):
                path.unlink()


def _cell(text: str) -> str:
    """Text for a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


# ---------------------------------------------------------------- tutorials


def tutorials() -> list[Path]:
    folder = OUT / "tutorials"
    made = set()
    for notebook in sorted((REPO / "tutorials").glob("*.ipynb")):
        made.add(folder / notebook.name)
        _link(folder / notebook.name, notebook)
    _prune(folder, made)
    return sorted(made)


# ---------------------------------------------------------------- labs

SOLUTION = ("### BEGIN SOLUTION", "### END SOLUTION")
HIDDEN = ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")
CODE_STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
TEXT_STUB = "YOUR ANSWER HERE"


def _between(source: str, begin: str, end: str, replacement: str | None) -> str:
    """``source`` with each ``begin``..``end`` region (lines included) replaced by
    ``replacement`` at the begin line's indentation, or removed when it is None."""
    out, inside = [], False
    for line in source.split("\n"):
        stripped = line.strip()
        if stripped.startswith(begin):
            if inside:
                raise ValueError(f"{begin!r} inside another region")
            inside = True
            if replacement is not None:
                indent = line[: len(line) - len(line.lstrip())]
                out.extend(indent + part for part in replacement.split("\n"))
        elif stripped.startswith(end):
            if not inside:
                raise ValueError(f"{end!r} without {begin!r}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{begin!r} without {end!r}")
    return "\n".join(out)


def student_version(notebook: dict) -> dict:
    """The notebook as ``nbgrader generate_assignment`` hands it out: solution regions
    replaced by the stub, hidden tests removed, outputs and execution counts cleared."""
    notebook = copy.deepcopy(notebook)
    for cell in notebook["cells"]:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        grading = cell.get("metadata", {}).get("nbgrader", {})
        code = cell["cell_type"] == "code"
        if SOLUTION[0] in source:
            source = _between(source, *SOLUTION, CODE_STUB if code else TEXT_STUB)
        elif grading.get("solution") and not grading.get("grade"):
            source = CODE_STUB if code else TEXT_STUB  # a solution cell without regions
        if HIDDEN[0] in source:
            source = _between(source, *HIDDEN, None).rstrip("\n")
        cell["source"] = source
        if code:
            cell["outputs"], cell["execution_count"] = [], None
    return notebook


def labs() -> list[Path]:
    folder = OUT / "labs"
    made = set()
    source = REPO / "tutorials" / "labs" / "source"
    for lab in sorted(p for p in source.iterdir() if p.is_dir() and not p.name.startswith(".")):
        notebooks = sorted(lab.glob("*.ipynb"))
        for notebook in notebooks:
            name = lab.name if len(notebooks) == 1 else f"{lab.name}-{notebook.stem}"
            student = student_version(json.loads(notebook.read_text()))
            path = folder / f"{name}.ipynb"
            _write(path, json.dumps(student, indent=1, ensure_ascii=False) + "\n")
            made.add(path)
    _prune(folder, made)
    return sorted(made)


# ---------------------------------------------------------------- magics


def _magic_rows(parser) -> list[tuple[str, str, str]]:
    rows = []
    for action in parser._actions:
        if action.dest == "help":
            continue
        if action.option_strings:
            names = ", ".join(action.option_strings)
            if action.nargs != 0:
                names += " " + (action.metavar or action.dest.upper())
        else:
            names = action.metavar or action.dest
            if action.nargs in ("?", "*"):
                names = f"[{names}]"
        default = "" if action.default in (None, False, [], "==SUPPRESS==") else repr(action.default)
        choices = f" (one of: {', '.join(map(str, action.choices))})" if action.choices else ""
        help_text = (action.help or "").replace("%%", "%") + choices
        rows.append((names, default, help_text))
    return rows


def magics() -> str:
    from nbrpc.kernel_ext.magics import RpcMagics

    kinds: dict[str, list[str]] = {}
    for kind, prefix in (("line", "%"), ("cell", "%%")):
        for name in RpcMagics.magics[kind]:
            kinds.setdefault(name, []).append(prefix + name)
    lines = [
        "# Magics",
        "",
        "Every magic that `%load_ext nbrpc` registers, made from the magics' own argument",
        "definitions (`nbrpc/kernel_ext/magics.py`) when the site is built. The",
        "[user guide](../guide/magics.md) shows them at work.",
        "",
    ]
    for name in sorted(kinds):
        method = getattr(RpcMagics, RpcMagics.magics["line"].get(name) or RpcMagics.magics["cell"][name])
        lines += [f"## {' and '.join(f'`{form}`' for form in kinds[name])}", ""]
        parser = getattr(method, "parser", None)
        # @magic_arguments puts the usage into __doc__; the magic's own words are the description
        doc = parser.description if parser is not None else inspect.getdoc(method)
        if doc:
            lines += [inspect.cleandoc(doc), ""]
        if parser is None:
            lines += ["```text", f"{kinds[name][0]}", "```", "", "It takes no arguments.", ""]
            continue
        usage = " ".join(parser.format_usage().split())
        usage = usage.removeprefix("usage:").removeprefix("::").strip()
        usage = textwrap.fill(usage, 88, subsequent_indent="    ", break_on_hyphens=False, break_long_words=False)
        lines += ["```text", usage, "```", "", "| argument | default | what it does |", "| --- | --- | --- |"]
        for names, default, help_text in _magic_rows(parser):
            lines.append(f"| `{names}` | {f'`{default}`' if default else ''} | {_cell(help_text)} |")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- api and errors


def _is_error(obj) -> bool:
    return inspect.isclass(obj) and issubclass(obj, BaseException)


def api() -> tuple[str, str]:
    import nbrpc
    import nbrpc.errors

    title = "Python API"
    api_lines = [title, "=" * len(title), "",
                 "Every name of ``nbrpc.__all__`` (the error classes are on :doc:`errors`), from the",
                 "code's own docstrings and signatures. ``import nbrpc`` does not import IPython or",
                 "ipywidgets; the widget classes load on first use.", ""]
    groups = {"Clusters": [], "Snapshots and recordings": [], "Views (widgets)": []}
    for name in sorted(nbrpc.__all__, key=str.lower):
        obj = getattr(nbrpc, name)
        if _is_error(obj):
            continue
        if name in nbrpc._WIDGETS:
            groups["Views (widgets)"].append((name, obj))
        elif name in ("Cluster", "SlurmOptions", "start", "current"):
            groups["Clusters"].append((name, obj))
        else:
            groups["Snapshots and recordings"].append((name, obj))
    for group, members in groups.items():
        api_lines += [group, "-" * len(group), ""]
        for name, obj in members:
            directive = "autoclass" if inspect.isclass(obj) else "autofunction"
            api_lines += [f".. {directive}:: nbrpc.{name}"]
            if inspect.isclass(obj):
                api_lines += ["   :members:", "   :exclude-members: __init__, __new__"]
            api_lines.append("")

    title = "Errors"
    error_lines = [title, "=" * len(title), "",
                   "nbrpc's errors, each a subclass of a builtin error, so ``except TimeoutError``",
                   "and the like catch them. Those exported as ``nbrpc.X`` come first; the others",
                   "are raised by nbrpc and importable from ``nbrpc.errors``.", ""]
    exported = [n for n in sorted(nbrpc.__all__) if _is_error(getattr(nbrpc, n))]
    others = sorted(n for n, obj in vars(nbrpc.errors).items()
                    if _is_error(obj) and not n.startswith("_") and obj.__module__ == "nbrpc.errors"
                    and n not in exported)
    for name in exported:
        error_lines += [f".. autoexception:: nbrpc.{name}", "   :show-inheritance:", ""]
    for name in others:
        error_lines += [f".. autoexception:: nbrpc.errors.{name}", "   :show-inheritance:", ""]
    return "\n".join(api_lines), "\n".join(error_lines)


# ---------------------------------------------------------------- settings


def settings_module():
    """The module of ``nbrpc`` that defines ``WorkerSettings`` (wherever it lives)."""
    import nbrpc

    package = Path(nbrpc.__file__).parent
    for path in sorted(package.rglob("*.py")):
        if re.search(r"^class WorkerSettings\b", path.read_text(), re.M):
            parts = path.relative_to(package.parent).with_suffix("").parts
            return importlib.import_module(".".join(parts))
    raise LookupError("no module of nbrpc defines WorkerSettings")


def _comment_above(lines: list[str], index: int) -> str:
    block = []
    while index > 0 and lines[index - 1].lstrip().startswith("#"):
        index -= 1
        block.insert(0, lines[index].strip().lstrip("#").strip())
    return " ".join(block)


def _comment_below(lines: list[str], index: int) -> str:
    block = []
    for line in lines[index:]:
        if not line.lstrip().startswith("#"):
            break
        block.append(line.strip().lstrip("#").strip())
    return " ".join(block)


def _trailing_comment(line: str) -> str:
    match = re.search(r"#\s*(.*)$", line.split('"')[-1] if '"' in line else line)
    return match.group(1).strip() if match else ""


def _variables(source: str) -> list[tuple[str, str, str]]:
    """(variable, Python name, what the source says of it) for every ``NBRPC_*`` (and other
    environment) variable named at module level, in source order."""
    lines = source.split("\n")
    found = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.Assign):
            continue
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            continue
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        index = node.lineno - 1
        said = _comment_above(lines, index) or _trailing_comment(lines[node.end_lineno - 1])
        if not said and not all(n.startswith("_") for n in names):
            # the nearest "Set by ..." comment above, which covers a group of names
            for back in range(index - 1, -1, -1):
                text = lines[back].strip()
                if text.startswith("# Set by"):
                    said = _comment_below(lines, back)
                    break
                if not text.startswith("#") and not re.match(r"^[A-Z_]+ = ", text) and text:
                    break
        if not said and all(n.startswith("_") for n in names):
            said = "Set by the driver in each worker's environment (``WorkerSettings.to_env``)."
        values = value.items() if isinstance(value, dict) else [(None, value)]
        for key, variable in values:
            if isinstance(variable, str) and re.fullmatch(r"[A-Z][A-Z0-9_]+", variable):
                found.append((variable, ", ".join(names) + (f"[{key!r}]" if key else ""), said))
            elif isinstance(key, str) and re.fullmatch(r"[A-Z][A-Z0-9_]+_[A-Z_]+", key):
                found.append((key, ", ".join(names), said))
    return found


def settings() -> str:
    module = settings_module()
    source = inspect.getsource(module)
    lines = ["# Settings and environment variables", "",
             f"Read from `{module.__name__}` (the module that defines `WorkerSettings`) when the",
             "site is built: its docstring, every environment variable it names with what its",
             "source says of it, and the fields of a worker's settings.", "",
             "```{eval-rst}", f".. automodule:: {module.__name__}", "   :no-members:", "   :no-index:", "```", "",
             "## Environment variables", "",
             "| variable | name in the code | what it is |", "| --- | --- | --- |"]
    for variable, name, said in _variables(source):
        said = said.replace("``", "`")
        lines.append(f"| `{variable}` | `{name}` | {_cell(said)} |")
    lines += ["", "## A worker's settings", "",
              "```{eval-rst}", f".. autoclass:: {module.__name__}.WorkerSettings", "   :no-members:",
              "   :no-index:", "```", "", "| field | type | default | what it is |",
              "| --- | --- | --- | --- |"]
    cls_source = inspect.getsource(module.WorkerSettings).split("\n")
    import dataclasses

    for f in dataclasses.fields(module.WorkerSettings):
        comment = next((_trailing_comment(line) for line in cls_source
                        if re.match(rf"\s+{f.name}:", line)), "")
        if f.default is not dataclasses.MISSING:
            default = f"`{f.default!r}`"
        elif f.default_factory is not dataclasses.MISSING:
            default = f"`{f.default_factory()!r}`"
        else:
            default = "(required)"
        kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        lines.append(f"| `{f.name}` | `{_cell(kind)}` | {default} | {_cell(comment.replace('``', '`'))} |")
    lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- performance


def _figure(value) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def performance(results: Path | None = None) -> str:
    results = results or REPO / "benchmarks" / "results.json"
    lines = ["## The latest stored run", ""]
    if not results.exists():
        lines += ["No benchmark results are stored: `benchmarks/results.json` is missing.",
                  "`make bench` writes it.", ""]
        return "\n".join(lines)
    data = json.loads(results.read_text())
    machine = data.get("machine", {})
    about = ", ".join(f"{k}: {v}" for k, v in machine.items()) if isinstance(machine, dict) else str(machine)
    lines += [f"From `benchmarks/results.json`: run on {data.get('date', 'an unknown date')} with torch "
              f"{data.get('torch', '(unknown)')}; machine: {about or '(not recorded)'}.", ""]
    if data.get("spread") is not None:
        lines += [f"The run's own spread: two measurements of the same raw torch code in this run "
                  f"parted by a ratio of {data['spread']:g}; read a ratio within that of its target as "
                  f"at the target.", ""]
    met = [row["met"] for row in data.get("rows", []) if row.get("met") is not None]  # None: no target
    lines += [f"{sum(met)} of {len(met)} targets met.", "",
              "| what | unit | nbrpc | reference | ratio | target | met | why / note |",
              "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in data.get("rows", []):
        reference = _figure(row.get("reference"))
        if reference and row.get("reference_name"):
            reference += f" ({row['reference_name']})"
        status = {True: "yes", False: "**no**"}.get(row.get("met"), "")
        lines.append("| " + " | ".join(_cell(x) for x in (
            row.get("what", ""), row.get("unit", ""), _figure(row.get("nbrpc")), reference,
            _figure(row.get("ratio")), row.get("target", ""), status, row.get("reason", "") or "")) + " |")
    lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- Sphinx


def generate(app=None, config=None) -> None:
    tutorials()
    labs()
    _write(OUT / "magics.md", magics())
    api_text, errors_text = api()
    _write(OUT / "api.rst", api_text + "\n")
    _write(OUT / "errors.rst", errors_text + "\n")
    _write(OUT / "settings.md", settings())
    _write(OUT / "performance.md", performance())


def setup(app):
    app.connect("config-inited", generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

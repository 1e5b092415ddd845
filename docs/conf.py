"""Sphinx configuration of nbrpc's documentation (``make docs``)."""

import sys
from importlib.metadata import version as _version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "nbrpc"
author = "nbrpc developers"
copyright = "2026, nbrpc developers"
release = _version("nbrpc")

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "nbrpc_docs",  # the generated pages: docs/_ext/nbrpc_docs.py
]

# Notebooks are shown with the outputs stored in them; nothing runs while the site builds.
nb_execution_mode = "off"
# A widget's stored view needs a kernel; its static fallback (the drawing as SVG in HTML, or
# text) is what a page can show.
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
myst_enable_extensions = ["colon_fence", "deflist"]
# Links to headings (page.md#a-heading) are checked like any other reference.
myst_heading_anchors = 4
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
# Parts that pages include, not pages of their own.
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "performance-method.md", "generated/performance.md"]

# Every reference must resolve: warnings are errors (-W) and nitpicky (-n) in `make docs`.
nitpicky = True
nitpick_ignore_regex = [
    # names from other projects' documentation, which is not fetched (no intersphinx offline)
    ("py:class", r"(torch|typing|typing_extensions|collections|ipywidgets|anywidget|traitlets|pathlib|os)\..*"),
    ("py:class", r"nbrpc\.[\w.]*\._\w+"),  # private bases (errors._OneLine): not documented
    ("py:class", r".* .*|[a-z_]+"),  # a docstring's words that napoleon takes for a type
]
autodoc_typehints = "none"
autodoc_member_order = "bysource"
napoleon_numpy_docstring = True
napoleon_google_docstring = False
# "bind, port" stays one entry, as the docstring groups them
napoleon_use_param = False

html_theme = "pydata_sphinx_theme"
html_title = "nbrpc"
html_static_path = ["_static"]
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
html_show_sourcelink = False

"""Sphinx configuration for dpsharp's API reference.

Build (from the repository root, with the ``docs`` extra installed next to an installed dpsharp):
``python -m sphinx -W --keep-going -b html docs docs/_build/html``.
"""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any

project = "dpsharp"
author = "dpsharp contributors"
copyright = "dpsharp contributors, Apache-2.0"  # noqa: A001 - Sphinx's name for it
release = importlib.metadata.version("dpsharp")
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # NumPy-style docstrings
    "sphinx.ext.mathjax",
    "myst_parser",  # the README (Markdown) as the overview page
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# NumPy docstrings only; "Attributes" sections become ivar fields so that they do not clash
# with the dataclass fields autodoc documents itself.
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_ivar = True
napoleon_use_rtype = False

autodoc_default_options = {
    "members": True,
    "undoc-members": False,
    "show-inheritance": True,
    "member-order": "bysource",
}
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_class_signature = "separated"
# ``from __future__ import annotations`` leaves hints as strings: do not fail on names that
# only exist under TYPE_CHECKING (torch tensors, peer libraries' classes).
autodoc_type_aliases: dict[str, str] = {}
nitpicky = False

myst_heading_anchors = 3

html_theme = "alabaster"
html_title = "dpsharp"
html_theme_options = {"description": "Tight, certified privacy accounting and DP training"}


# The docstrings write absolute values and set sizes as |x| (plain-text formulas, readable in
# ``help()``); reStructuredText would read |x| as a substitution reference. Escape the bars
# outside literal blocks, doctest blocks and backquoted text so that they render as written.
_BACKQUOTED = re.compile(r"(``.+?``|`[^`]*`)")


def _escape_bars(line: str) -> str:
    parts = _BACKQUOTED.split(line)
    return "".join(part if index % 2 else part.replace("|", "\\|")
                   for index, part in enumerate(parts))


def _escape_bars_in_docstring(app: Any, what: str, name: str, obj: Any, options: Any,
                              lines: list[str]) -> None:
    literal_indent: int | None = None  # indentation of the paragraph that opened a "::" block
    in_doctest = False
    for index, line in enumerate(lines):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if literal_indent is not None:
            if not stripped or indent > literal_indent:
                continue
            literal_indent = None
        if in_doctest:
            if stripped:
                continue
            in_doctest = False
        if stripped.startswith(">>>"):
            in_doctest = True
            continue
        lines[index] = _escape_bars(line)
        if stripped.endswith("::"):
            literal_indent = indent


def setup(app: Any) -> None:
    # After napoleon (priority 500) has turned the NumPy sections into fields.
    app.connect("autodoc-process-docstring", _escape_bars_in_docstring, priority=600)

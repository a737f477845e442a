"""Writing a bench script's printed lines to its results file."""

from __future__ import annotations

import os
from collections.abc import Sequence


def write_lines(path: str, lines: Sequence[str]) -> None:
    """Write ``lines`` to ``path`` (one per line), making its folder first."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")

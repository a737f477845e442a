"""Loads the compiled core. dpsharp never falls back to slow pure-Python numerics: if
``dpsharp._core`` is missing, importing dpsharp fails with instructions."""

from __future__ import annotations

try:
    from dpsharp import _core as core
except ImportError as exc:  # pragma: no cover - exercised by tests/test_import.py in a subprocess
    raise ImportError(
        "dpsharp's compiled core (dpsharp._core) could not be imported: "
        f"{exc}. dpsharp must be installed with its C++ extension built, e.g. "
        "`pip install .` from a source checkout (needs a C++17 compiler and CMake >= 3.20). "
        "Importing from the source tree without building it does not work."
    ) from exc

__all__ = ["core"]

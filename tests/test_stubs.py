"""python/dpsharp/_core.pyi stays in step with the compiled module: every attribute that the
bindings create has a stub, and every stub names something the module has."""

from __future__ import annotations

import ast
from pathlib import Path

import dpsharp

STUB = Path(dpsharp.__file__).with_name("_core.pyi")


def stub_names() -> set[str]:
    tree = ast.parse(STUB.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_every_core_attribute_has_a_stub_and_back() -> None:
    core = dpsharp._core_module
    public = {name for name in dir(core) if not name.startswith("__")}
    stubs = stub_names()
    assert public - stubs == set(), f"attributes of dpsharp._core without a stub in {STUB.name}"
    # The CUDA kernel entry points exist only in a CUDA build (cpp/bindings/bind_clip_cuda.cpp).
    cuda_only = {"cuda_clip_per_example_sq_norms", "cuda_clip_per_example_dot_partials",
                 "cuda_clip_weighted_rows", "cuda_clip_accumulate_noise", "cuda_clip_release_noise",
                 "cuda_clip_sq_norm_partials_many", "cuda_clip_weighted_rows_many",
                 "cuda_gaussian_noise"}
    expected_missing = set() if core.build_info()["cuda"] else cuda_only
    assert stubs - public == expected_missing, f"stubs in {STUB.name} for names dpsharp._core lacks"


def test_py_typed_marker_ships() -> None:
    assert Path(dpsharp.__file__).with_name("py.typed").exists()


def test_public_api_is_exported_and_documented() -> None:
    for name in dpsharp.__all__:
        assert hasattr(dpsharp, name), name
        value = getattr(dpsharp, name)
        if callable(value) or isinstance(value, type(dpsharp)):
            assert (getattr(value, "__doc__", None) or "").strip(), f"dpsharp.{name} has no docstring"
    for name in ("accountant", "available", "calibrate", "compat", "plots"):
        assert name in dpsharp.__all__


def test_import_dpsharp_loads_no_optional_library() -> None:
    import subprocess
    import sys

    script = (
        "import sys, dpsharp, dpsharp.compat.opacus, dpsharp.compat.dp_accounting, "
        "dpsharp.compat.prv_accountant, dpsharp.plots, dpsharp.cli\n"
        "print(sorted(m for m in ('torch', 'opacus', 'dp_accounting', 'prv_accountant', 'matplotlib') "
        "if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"

"""The package imports with its compiled core, and fails loudly without it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import dpsharp


def test_build_info_reports_release_without_fast_math() -> None:
    info = dpsharp._core_module.build_info()
    assert info["version"] == dpsharp.__version__
    assert info["fast_math"] is False
    assert isinstance(info["cuda"], bool)


def test_missing_core_raises_clear_import_error() -> None:
    # Block dpsharp._core with a meta-path finder in a fresh interpreter: the import must fail
    # with instructions, not fall back to anything.
    script = textwrap.dedent(
        """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "dpsharp._core":
                    raise ImportError("blocked for the test")
                return None
        sys.meta_path.insert(0, Block())
        try:
            import dpsharp
        except ImportError as exc:
            print("IMPORT-ERROR:", exc)
        else:
            print("IMPORTED")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "IMPORT-ERROR:" in result.stdout, result.stdout + result.stderr
    assert "compiled core" in result.stdout and "pip install" in result.stdout


def test_log_normal_cdf_matches_mpmath_in_both_tails() -> None:
    import mpmath
    import numpy as np

    mpmath.mp.dps = 50
    xs = np.array([-1e3, -200.0, -38.5, -20.0001, -19.999, -5.0, -1.0, 0.0, 0.5, 3.0, 8.0, 30.0])
    ours = dpsharp._core_module.log_normal_cdf(xs)
    for x, value in zip(xs, ours):
        exact = mpmath.log(mpmath.ncdf(mpmath.mpf(float(x))))
        assert abs(value - float(exact)) <= 1e-13 * max(1.0, abs(float(exact))) + 1e-300, (x, value, exact)

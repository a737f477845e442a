"""Type stubs for dpsharp's compiled core (cpp/bindings/*.cpp). Internal: the public API
wraps these functions and never returns _core types. tests/test_stubs.py checks that every
attribute of the built module has a stub here and that every stub exists in the module."""

from typing import Any, overload

import numpy as np
import numpy.typing as npt

def build_info() -> dict[str, Any]:
    """How this module was built: version, build type, whether CUDA kernels are included."""

@overload
def log_normal_cdf(x: float) -> float: ...
@overload
def log_normal_cdf(x: npt.ArrayLike) -> np.ndarray: ...

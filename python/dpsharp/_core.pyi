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

# --- privacy-loss distributions (cpp/bindings/bind_pld.cpp) ---------------------------------
def pld_discretize(
    mechanism: int,
    parameter: float,
    sampling_rate: float,
    grid_step: float,
    top_tail: float,
    bottom_tail: float,
    pessimistic: bool,
) -> tuple[int, np.ndarray, float]:
    """Discretise a privacy-loss distribution on the grid k * grid_step: (offset, mass,
    infinity_mass), mass[i] at loss (offset + i) * grid_step. mechanism: 0 Gaussian,
    1 Laplace, 2 Poisson remove, 3 Poisson add, 4 symmetrised sampled Gaussian."""

def pld_log_hockey_stick(mechanism: int, parameter: float, sampling_rate: float, loss: float) -> float:
    """log delta(eps = loss) of the continuous dominating pair (-inf when delta is 0)."""

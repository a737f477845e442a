"""Drop-in adapters for code written against the field's accounting libraries.

* :mod:`dpsharp.compat.opacus`: accountants with Opacus' accountant interface
  (``engine.accountant = dpsharp.compat.opacus.PLDAccountant()``) and ``get_noise_multiplier``.
* :mod:`dpsharp.compat.dp_accounting`: dp-accounting's ``DpEvent`` objects converted to dpsharp
  events and back, and ``PrivacyAccountant``-style ``PLDAccountant`` / ``RDPAccountant``.
* :mod:`dpsharp.compat.prv_accountant`: prv-accountant's ``Accountant(...).compute_epsilon``.

Each adapter imports its peer library lazily (only where a peer object must be built or
recognised), so ``import dpsharp.compat.opacus`` works without Opacus installed. The numbers
always come from dpsharp's own accountants.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["dp_accounting", "opacus", "prv_accountant"]


def __getattr__(name: str) -> ModuleType:
    if name in __all__:
        return importlib.import_module(f"dpsharp.compat.{name}")
    raise AttributeError(f"module 'dpsharp.compat' has no attribute {name!r}")

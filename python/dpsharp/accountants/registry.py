"""Accountants by name: ``dpsharp.accountant("pld")``, ``dpsharp.accountants.available()``.

Each accountant module registers its class with :func:`register`; the CLI, calibration and the
benchmarks look accountants up here, so one loop can compare them all on the same events.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from typing import Any, Callable, TypeVar

from dpsharp.accountants.base import Accountant

__all__ = ["accountant", "available", "register"]

_REGISTRY: dict[str, type[Accountant]] = {}

# The modules of dpsharp's accountant families, imported on first use of the registry so every
# family is reachable by name however dpsharp was imported. Listed tightest first: this is the
# order of available() (and of the CLI's reports).
_FAMILY_MODULES = (
    "dpsharp.accountants.pld",  # "pld" (tight, certified)
    "dpsharp.accountants.rdp",  # "rdp", "moments"
    "dpsharp.accountants.gdp",  # "gdp" (CLT)
    "dpsharp.accountants.zcdp",  # "zcdp"
    "dpsharp.accountants.classic",  # "classic"
)
_FAMILY_ORDER = ("pld", "rdp", "moments", "gdp", "zcdp", "classic")
_families_loaded = False


def _load_families() -> None:
    global _families_loaded
    if _families_loaded:
        return
    _families_loaded = True
    for module in _FAMILY_MODULES:
        importlib.import_module(module)

AccountantClass = TypeVar("AccountantClass", bound=type[Accountant])


def register(name: str) -> Callable[[AccountantClass], AccountantClass]:
    """Class decorator: make ``cls`` available as ``accountant(name)``."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"accountant name must be a non-empty string, got {name!r}")

    def decorate(cls: AccountantClass) -> AccountantClass:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"an accountant named {name!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def available() -> list[str]:
    """The registered accountant names: dpsharp's families ("pld", "rdp", "moments", "gdp",
    "zcdp", "classic") tightest first, then any registered later."""
    _load_families()
    rank = {name: index for index, name in enumerate(_FAMILY_ORDER)}
    return sorted(_REGISTRY, key=lambda name: rank.get(name, len(rank)))


def accountant(name: str, **options: Any) -> Accountant:
    """A new accountant of the family ``name`` (see :func:`available`), built with ``options``."""
    _load_families()
    valid = ", ".join(map(repr, available()))
    if not isinstance(name, str):
        raise TypeError(
            f"accountant name must be a string, one of {valid}; got {name!r} "
            f"({type(name).__name__})"
        )
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"accountant name must be one of {valid}; got {name!r}") from None
    accepted = _option_names(cls)
    if accepted is not None:
        unknown = [key for key in options if key not in accepted]
        if unknown:
            raise TypeError(
                f"accountant {name!r} ({cls.__name__}) has no option {unknown[0]!r}; its "
                f"options are {', '.join(map(repr, accepted)) or 'none'}"
            )
    return cls(**options)


@functools.lru_cache(maxsize=None)  # inspect.signature costs ~0.2 ms, more than most builds
def _option_names(cls: type[Accountant]) -> list[str] | None:
    """The keyword options of ``cls``'s constructor (None if it takes ``**kwargs``)."""
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return [
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]

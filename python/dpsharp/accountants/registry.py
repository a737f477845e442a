"""Accountants by name: ``dpsharp.accountant("pld")``, ``dpsharp.accountants.available()``.

Each accountant module registers its class with :func:`register`; the CLI, calibration and the
benchmarks look accountants up here, so one loop can compare them all on the same events.
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from dpsharp.accountants.base import Accountant

__all__ = ["accountant", "available", "register"]

_REGISTRY: dict[str, type[Accountant]] = {}

AccountantClass = TypeVar("AccountantClass", bound=type[Accountant])


def register(name: str) -> Callable[[AccountantClass], AccountantClass]:
    """Class decorator: make ``cls`` available as ``accountant(name)``."""

    def decorate(cls: AccountantClass) -> AccountantClass:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"an accountant named {name!r} is already registered")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def available() -> list[str]:
    """The registered accountant names, in registration order."""
    return list(_REGISTRY)


def accountant(name: str, **options: Any) -> Accountant:
    """A new accountant of the family ``name`` (see :func:`available`), built with ``options``."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise ValueError(
            f"accountant name must be one of {', '.join(map(repr, _REGISTRY))}; got {name!r}"
        ) from None
    return cls(**options)

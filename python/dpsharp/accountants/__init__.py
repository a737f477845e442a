"""Privacy accountants: one module per family, a shared interface (base) and a registry."""

from __future__ import annotations

from dpsharp.accountants.base import Accountant, PrivacyGuarantee, UnsupportedEventError
from dpsharp.accountants.registry import accountant, available, register
from dpsharp.accountants.classic import ClassicAccountant
from dpsharp.accountants.gdp import GDPAccountant
from dpsharp.accountants.pld import PLDAccountant
from dpsharp.accountants.zcdp import ZCDPAccountant

__all__ = [
    "Accountant",
    "ClassicAccountant",
    "GDPAccountant",
    "PLDAccountant",
    "PrivacyGuarantee",
    "UnsupportedEventError",
    "ZCDPAccountant",
    "accountant",
    "available",
    "register",
]

"""Privacy accountants: one module per family, a shared interface (base) and a registry."""

from __future__ import annotations

from dpsharp.accountants.base import Accountant, PrivacyGuarantee, UnsupportedEventError
from dpsharp.accountants.registry import accountant, available, register
from dpsharp.accountants.pld import PLDAccountant
from dpsharp.accountants.rdp import MomentsAccountant, RDPAccountant

__all__ = [
    "Accountant",
    "MomentsAccountant",
    "PLDAccountant",
    "PrivacyGuarantee",
    "RDPAccountant",
    "UnsupportedEventError",
    "accountant",
    "available",
    "register",
]

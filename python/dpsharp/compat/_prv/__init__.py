"""The implementation of :mod:`dpsharp.compat.prv_accountant` (prv-accountant's module tree on
dpsharp's accountants); import it through that module."""

"""dpsharp's default PLD answers are at least as tight as dp-accounting's default answers on every
query that dp-accounting's own test files make of its PLDAccountant.

tests/peers/pld_defaults.py runs dp-accounting 0.6.0's installed test files (unmodified) with
dpsharp's adapter in the peer's place and records, for every get_epsilon / get_delta query,
dpsharp's answer and dp-accounting's own answer to the same query at its default
value_discretization_interval (1e-4), computed by dp-accounting in that run. Nothing here is a
hard-coded value.

Two settings are known to stay looser, by the proven round-off bound of the FFT composition:
at delta = 1e-6 and epsilon about 17 (the mixture-of-Gaussians and truncated Poisson-sampled
Gaussian compositions of dp-accounting's tests) dp-accounting's answer is within about 1e-8 of
the exact epsilon (dpsharp's own lower bounds on ever finer grids bracket it there), while the
certified upper bound adds the FFT's proven round-off bound (about 3e-13 in delta, 2.7e-7 in
epsilon) and the truncation budget's mass (5e-13). A finer grid does not help (the round-off
bound grows with the spectrum's width); what would is a composition whose round-off is
relative to the tail queried (e.g. an exponentially tilted composition). They are asserted in
a strict xfail, so that closing the gap is noticed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("dp_accounting")

pytestmark = [pytest.mark.peers, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "peers"))
import pld_defaults  # noqa: E402

#: (dp-accounting test name, query) of the settings where the certified round-off bound keeps
#: dpsharp above dp-accounting's default answer (module docstring)
ROUNDOFF_BOUND = {
    ("test_mixture_of_gaussians_basic", "get_epsilon"),
    ("test_mixture_of_gaussians_basic", "get_delta"),
    ("test_truncated_subsampled_gaussian_basic", "get_epsilon"),
    ("test_truncated_subsampled_gaussian_basic", "get_delta"),
}


def _name(row: dict[str, Any]) -> tuple[str, str]:
    return row["test"].split("::")[-1], row["query"]


@pytest.fixture(scope="module")
def rows() -> list[dict[str, Any]]:
    recorded = pld_defaults.collect()
    # every test file of FILES was run and queried the adapter
    assert {row["test"].split("::")[0].rsplit("/", 1)[-1] for row in recorded} == {
        Path(name).name for name in pld_defaults.FILES}
    return pld_defaults.settings(recorded)


def test_dpsharp_default_is_at_most_dp_accountings_default(rows: list[dict[str, Any]]) -> None:
    """On every setting but those of ROUNDOFF_BOUND, dpsharp's default epsilon and delta are at
    most dp-accounting's default answers (which the peer computed in this run); on those,
    above by less than 1e-7 relative in epsilon and 2e-6 in delta."""
    assert len(rows) >= 100
    answered = [row for row in rows if row["peer"] is not None]
    assert len(answered) >= 100, [row["peer_error"] for row in rows if row["peer"] is None]
    looser = [
        (row["test"], row["query"], row["argument"], row["dpsharp"], row["peer"])
        for row in answered
        if pld_defaults.looser(row) and _name(row) not in ROUNDOFF_BOUND
    ]
    assert not looser, looser
    known = [row for row in answered if _name(row) in ROUNDOFF_BOUND]
    assert {_name(row) for row in known} == ROUNDOFF_BOUND
    for row in known:
        limit = 1e-7 if row["query"] == "get_epsilon" else 2e-6
        assert row["dpsharp"] <= row["peer"] * (1.0 + limit), row


@pytest.mark.xfail(strict=True, reason="the certified FFT round-off bound (about 3e-13 in "
                   "delta) exceeds dp-accounting's distance to the exact answer here")
def test_dpsharp_default_is_at_most_dp_accountings_default_near_the_roundoff_bound(
    rows: list[dict[str, Any]],
) -> None:
    known = [row for row in rows if _name(row) in ROUNDOFF_BOUND and row["peer"] is not None]
    assert known
    assert all(row["dpsharp"] <= row["peer"] for row in known), [
        (row["test"], row["query"], row["dpsharp"], row["peer"]) for row in known]

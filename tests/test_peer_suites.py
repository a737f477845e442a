"""The peers' own test files against dpsharp's adapters: no regression from the recorded run.

tests/peers/run_peer_suites.py runs dp-accounting's and Opacus' installed test files with
dpsharp's adapters substituted for the peers' accountant classes and records every outcome in
bench/results/peer_suites.json (and .md). Here a representative file, dp-accounting's PLD
accountant tests, is run again: every test recorded as passing with the adapter must still
pass, and dpsharp's adapter must really be exercised.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("dp_accounting")

pytestmark = [pytest.mark.peers, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "peers"))
import run_peer_suites  # noqa: E402

FILE = "pld/pld_privacy_accountant_test.py"


def test_dp_accountings_pld_tests_keep_passing_on_the_adapter() -> None:
    recorded = json.loads((ROOT / "bench" / "results" / "peer_suites.json").read_text())
    expected = {
        row["nodeid"] for row in recorded["suites"]["dp_accounting"]["adapter"]
        if row["outcome"] == "passed" and FILE in row["nodeid"]
    }
    assert expected
    rows = run_peer_suites.run_suite("dp_accounting", "adapter", False, only=[FILE])
    passed = {row["nodeid"] for row in rows if row["outcome"] == "passed"}
    assert expected <= passed, sorted(expected - passed)
    assert sum(row["exercised"] and row["outcome"] == "passed" for row in rows) >= 40


@pytest.mark.slow
def test_prv_accountants_own_tests_pass_on_the_adapter(tmp_path: Path) -> None:
    """prv-accountant 0.2.0's own tests (fetched at test time: its sdist ships none, so from a
    git archive of its v0.2.0 tag, DPSHARP_PRV_ACCOUNTANT_GIT, or a clone) against
    dpsharp.compat.prv_accountant: every exercised test in these files passes."""
    pytest.importorskip("prv_accountant")
    found, how = run_peer_suites.prv_sources(tmp_path)
    if found is None:
        pytest.skip(f"prv-accountant's tests are not reachable here: {how}")
    run_peer_suites.SOURCE_DIRS["prv_accountant"] = found
    files = ["test_readme.py", "test_backwards_compatibility.py",
             "test_discrete_privacy_random_variable.py", "test_privacy_random_variables"]
    rows = run_peer_suites.run_suite("prv_accountant", "adapter", False, only=files)
    exercised = [row for row in rows if row["exercised"]]
    assert len(exercised) >= 25
    assert all(row["outcome"] == "passed" for row in exercised), [
        (row["nodeid"], row["message"]) for row in exercised if row["outcome"] != "passed"]

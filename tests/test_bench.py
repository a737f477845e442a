"""``dpsharp bench precision`` / ``speed``: the peers' rows equal the peers called directly, the
dpsharp rows equal the accountants, the outputs are written, and without peers it still runs."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

import dpsharp
from dpsharp.bench import precision
from dpsharp.bench.peers import PEERS

SMALL = [precision.Setting("small", 0.01, 1.5, 200)]


def _row(results: dict, accountant: str) -> dict:
    return next(r for r in results["rows"] if r["accountant"] == accountant)


def test_dpsharp_rows_equal_the_accountants_and_gap_is_to_the_tightest_bound(tmp_path: Path) -> None:
    results = precision.run_precision(SMALL, use_peers=False)
    event = dpsharp.PoissonSampled(dpsharp.Gaussian(1.5), 0.01)
    uppers = []
    for name in dpsharp.available():
        acc = dpsharp.accountant(name)
        if not acc.supports(event):
            continue
        g = acc.compose(event, 200).guarantee(1e-5)
        row = _row(results, f"dpsharp.{name}")
        assert row["epsilon"] == pytest.approx(g.epsilon, rel=1e-12)
        assert row["certified"] is bool(g.certified)
        if g.certified:
            uppers.append(g.epsilon)
    tight = min(uppers)
    for row in results["rows"]:
        assert row["gap"] == pytest.approx(row["epsilon"] - tight, abs=1e-12)
    assert min(r["gap"] for r in results["rows"] if r["certified"]) == pytest.approx(0.0, abs=1e-12)
    files = precision.write_outputs(results, tmp_path, plots=False)
    assert {f.name for f in files} == {"results.json", "results.csv", "results.md"}
    assert json.loads((tmp_path / "results.json").read_text())["rows"] == json.loads(json.dumps(results["rows"]))
    with (tmp_path / "results.csv").open() as handle:
        assert len(list(csv.DictReader(handle))) == len(results["rows"])
    assert (tmp_path / "results.md").read_text().count("| small |") == len(results["rows"])


def test_grid_file_and_bad_grid(tmp_path: Path) -> None:
    path = tmp_path / "grid.json"
    path.write_text(json.dumps([{"q": 0.02, "sigma": 1.0, "T": 50, "name": "mine"}]))
    assert precision.load_grid(path) == [precision.Setting("mine", 0.02, 1.0, 50)]
    path.write_text(json.dumps([{"q": 0.02, "sigma": 1.0}]))
    with pytest.raises(ValueError, match="steps"):
        precision.load_grid(path)
    with pytest.raises(ValueError, match="sigma"):
        precision.Setting("x", 0.1, math.nan, 10)
    with pytest.raises(ValueError, match="q must be in"):
        precision.Setting("x", 1.5, 1.0, 10)


def test_cli_without_peers_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dpsharp.cli import main

    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps([{"q": 0.01, "sigma": 1.5, "steps": 100}]))
    assert main(["bench", "precision", "--grid", str(grid), "--no-peers", "--output", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out  # results.md: "Peers skipped: (peers disabled)."
    assert "peers skipped" in out.lower() and "dpsharp.pld" in out
    assert (tmp_path / "o" / "results.md").exists()


@pytest.mark.peers
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_peer_rows_equal_the_peers_called_directly() -> None:
    dp_accounting = pytest.importorskip("dp_accounting")
    prv_accountant = pytest.importorskip("prv_accountant")
    opacus_accountants = pytest.importorskip("opacus.accountants")
    results = precision.run_precision(SMALL)
    assert results["skipped_peers"] == []
    q, sigma, steps, delta = 0.01, 1.5, 200, 1e-5
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    rdp = dp_accounting.rdp.RdpAccountant()
    rdp.compose(event, steps)
    assert _row(results, "dp_accounting.rdp")["epsilon"] == rdp.get_epsilon(delta)
    for interval in (1e-2, 1e-3):
        pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=interval)
        pld.compose(event, steps)
        assert _row(results, f"dp_accounting.pld(interval={interval:g})")["epsilon"] == pld.get_epsilon(delta)
    prv = prv_accountant.Accountant(noise_multiplier=sigma, sampling_probability=q, delta=delta,
                                    eps_error=0.01, max_compositions=steps)
    lower, estimate, upper = prv.compute_epsilon(num_compositions=steps)
    row = _row(results, "prv_accountant")
    assert (row["epsilon_lower"], row["epsilon"], row["epsilon_upper"]) == (lower, estimate, upper)
    for kind, cls in (("rdp", opacus_accountants.RDPAccountant), ("prv", opacus_accountants.PRVAccountant)):
        acc = cls()
        acc.history = [(sigma, q, steps)]
        assert _row(results, f"opacus.{kind}")["epsilon"] == acc.get_epsilon(delta)
    assert {r["accountant"] for r in results["rows"]} >= set(PEERS)
    # the tight accountant agrees with the fine-grid PLD peer to its discretisation
    assert _row(results, "dpsharp.pld")["epsilon"] == pytest.approx(
        _row(results, "dp_accounting.pld(interval=0.001)")["epsilon"], abs=5e-3)


def test_speed_quick_runs_without_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsharp.bench import speed

    results = speed.run_speed(quick=True, use_peers=False, repeats=1)
    records = results["sweeps"]["T"]["records"]["dpsharp.pld"]
    assert [r["repeats"] for r in records] == [1, 1, 1]
    assert results["sweeps"]["T"]["ratio_to_dpsharp_pld"]["dpsharp.pld"] == [1.0, 1.0, 1.0]
    event = dpsharp.PoissonSampled(dpsharp.Gaussian(1.0), 0.01)
    assert records[0]["epsilon"] == pytest.approx(dpsharp.accountant("pld").compose(event, 1000).epsilon(1e-5))


def test_without_peer_libraries_it_runs_and_names_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsharp.bench import peers

    monkeypatch.setattr(peers, "_installed", lambda module: False)
    results = precision.run_precision(SMALL)
    assert results["skipped_peers"] == ["dp_accounting", "opacus", "prv_accountant"]
    assert {r["library"] for r in results["rows"]} == {"dpsharp"}

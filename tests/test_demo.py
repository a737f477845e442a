"""``dpsharp demo`` (a shortened run): it trains, its printed numbers are the accountants' own
for the run it trained (recomputed here through the Python API), and its plots exist and hold
those numbers (read back from demo.json, which the figures are drawn from)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

import dpsharp


@pytest.mark.torch
def test_short_demo_trains_prints_statements_and_writes_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    pytest.importorskip("matplotlib")
    pytest.importorskip("tqdm")
    from dpsharp.cli import main

    out_dir = tmp_path / "demo"
    status = main(["demo", "--epochs", "2", "--output", str(out_dir), "--no-progress"])
    out = capsys.readouterr().out
    assert status == 0
    for name in ("epsilon_vs_epoch.png", "tradeoff.png"):
        data = (out_dir / name).read_bytes()
        assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"
    document = json.loads((out_dir / "demo.json").read_text())
    training = document["training"]
    assert training["epochs_run"] == 2 and not training["stopped_by_budget"]
    # accuracy printed = accuracy recorded (two noisy epochs need not beat chance)
    printed = float(re.search(r"Test accuracy: ([0-9.]+)", out).group(1))
    assert printed == pytest.approx(training["test_accuracy"], abs=5e-5)
    assert 0.0 <= printed <= 1.0
    # every accountant's statement equals the API on the same events
    q, sigma, steps = training["sample_rate"], training["noise_multiplier"], training["steps"]
    event = dpsharp.PoissonSampled(dpsharp.Gaussian(sigma), q)
    for name in dpsharp.available():
        acc = dpsharp.accountant(name)
        line = re.search(rf"^\s+{name}\s+epsilon =\s+(\S+)", out, re.M)
        assert line is not None, name
        if not acc.supports(event):
            assert line.group(1) == "-"
            continue
        expected = acc.compose(event, steps).epsilon(1e-5)
        shown = float(line.group(1))
        if document["accountants"][name]["certified"]:  # 4 decimals, rounded up
            assert expected <= shown <= expected + 1e-4 * (1.0 + 1e-9), name
        else:  # an approximation: 4 decimals, rounded to nearest
            assert shown == pytest.approx(expected, abs=6e-5), name
        assert document["accountants"][name]["epsilon"] == pytest.approx(expected, rel=1e-9)
    # the budget held: the tight accountant's epsilon is within the target 3
    pld = dpsharp.accountant("pld").compose(event, steps).epsilon(1e-5)
    assert pld <= 3.0 + 1e-9
    assert training["epsilon"] == pytest.approx(pld, rel=1e-6)
    # epsilon-vs-epoch series: every applicable accountant but the classic bound (drawn only
    # with --plot-classic: far above the others, it pressed them into a band near 0, on a linear
    # axis), increasing, last point = full run
    applicable = {n for n, f in document["accountants"].items() if f["applicable"]}
    assert set(document["epsilon_vs_epoch"]) == applicable - {"classic"}
    for name, series in document["epsilon_vs_epoch"].items():
        eps = series["epsilon"]
        assert all(b >= a - 1e-9 for a, b in zip(eps, eps[1:])), name
        assert eps[-1] == pytest.approx(document["accountants"][name]["epsilon"], rel=1e-6)
    # trade-off: a certified mu-GDP statement means the composition's curve f >= G_mu; it is
    # drawn only where informative (a subsampled run is mu-GDP only for mu >= sqrt(T)/sigma)
    tradeoff = document["tradeoff"]
    assert tradeoff["gdp_mu_informative"] == ("gdp_certified" in tradeoff)
    assert tradeoff["gdp_mu_certified"] == pytest.approx(math.sqrt(steps) / sigma, rel=1e-9)
    for f, g in zip(tradeoff["pld"], tradeoff.get("gdp_certified", [])):
        assert f >= g - 1e-6

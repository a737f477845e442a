"""bench/make_figures.py: the numbers behind the reproduced figures equal the papers' printed
numbers (Abadi et al. 2016, Bu et al. 2020, Yu et al. 2019), the tight
accountant lies below every certified curve, and the committed figures.json is what the script
computes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def figures():
    spec = importlib.util.spec_from_file_location("make_figures", ROOT / "bench" / "make_figures.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_002_fig2_moments_accountant(figures) -> None:
    data = figures.figure_002_fig2(epochs=[100, 400])
    # Abadi et al. 2016: 1.2586 at T = 10^4, 2.5759 at T = 4*10^4
    assert data["moments accountant"] == pytest.approx([1.2586, 2.5759], abs=5e-5)
    for tight, ma, strong in zip(data["dpsharp tight (pld)"], data["moments accountant"], data["strong composition"]):
        assert tight < ma < strong


def test_000_fig2_clt_and_moments_at_1e5(figures) -> None:
    data = figures.figure_000_fig2()
    i = data["delta"].index(1e-5)
    # Bu et al. 2020: MNIST sigma 0.7, 45 epochs: mu 1.134, CLT eps 5.066, MA 7.1006
    assert data["mu_clt"] == pytest.approx(1.134, abs=5e-4)
    assert data["CLT (mu-GDP)"][i] == pytest.approx(5.066, abs=5e-4)
    assert data["moments accountant"][i] == pytest.approx(7.1006, abs=5e-5)
    assert all(t <= m for t, m in zip(data["dpsharp tight (pld)"], data["moments accountant"]))
    assert all(a >= b for a, b in zip(data["CLT (mu-GDP)"], data["CLT (mu-GDP)"][1:]))


def test_000_fig3_tradeoff(figures) -> None:
    data = figures.figure_000_fig3()
    assert data["mu_clt"] == pytest.approx(1.13, abs=5e-3)  # the paper's printed mu
    assert data["epsilon_moments"] == pytest.approx(7.1006, abs=5e-5)
    # the tight curve is a valid trade-off function above the moments accountant's (eps, delta) curve
    assert all(t >= m - 1e-9 for t, m in zip(data["dpsharp tight (pld)"], data["moments accountant (eps, delta)"]))


def test_004_fig2(figures) -> None:
    data = figures.figure_004_fig2(epochs=[400])
    # Yu et al. 2019: q 0.01, sigma 6, 400 epochs: 21.551 / 2.37 / 1.6705
    assert data["zCDP reshuffling"][0] == pytest.approx(21.551, abs=5e-4)
    assert data["zCDP sampling"][0] == pytest.approx(2.37, abs=5e-3)
    assert data["moments accountant"][0] == pytest.approx(1.6705, abs=5e-5)
    assert data["dpsharp tight (pld)"][0] < data["moments accountant"][0]


def test_committed_figure_data_is_what_the_script_computes(figures) -> None:
    path = ROOT / "bench" / "results" / "figures" / "figures.json"
    if not path.exists():
        pytest.skip("bench/results/figures not generated (python bench/make_figures.py)")
    committed = json.loads(path.read_text())
    fresh = {"002_fig2": figures.figure_002_fig2(), "004_fig2": figures.figure_004_fig2()}
    # rel 1e-6: the tight accountant's answers move at the 1e-9 level with round-off (the order of
    # FFT-domain products, how log|F| is formed), and the figures show 3-4 digits.
    for key, data in fresh.items():
        for name, values in data.items():
            assert committed[key][name] == pytest.approx(values, rel=1e-6), (key, name)
    for name in ("002_fig2.png", "000_fig2.png", "000_fig3.png", "004_fig2.png"):
        assert (path.parent / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_epsilon_plot_refuses_an_unknown_scale():
    pytest.importorskip("matplotlib")
    from dpsharp import plots

    with pytest.raises(ValueError, match="yscale must be 'auto', 'linear' or 'log'"):
        plots.epsilon_vs_epochs({"rdp": ([1, 2], [0.5, 0.7])}, delta=1e-5, yscale="symlog")

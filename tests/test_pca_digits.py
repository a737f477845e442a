"""DP-PCA(k=30) front end + DP-SGD on digits through the privacy engine: the reported combined
epsilon is the accountant's epsilon of (training events + the PCA event), and the model learns."""

from __future__ import annotations

import importlib.util
import pathlib

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")
pytest.importorskip("dpsharp.torch.clipper")

from dpsharp.accountants import accountant as make_accountant
from dpsharp.accountants import available
from dpsharp.events import Gaussian, PoissonSampled

pytestmark = [pytest.mark.torch, pytest.mark.slow]

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "dp_pca_digits.py"


def _example():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("dp_pca_digits", EXAMPLE)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_digits_pipeline_reports_combined_epsilon_and_learns() -> None:
    name = "rdp" if "rdp" in available() else "pld"
    result = _example().run(accountant=name, epochs=10, seed=0)
    steps = result["steps"]
    q = 64 / 1400
    reference = make_accountant(name)
    reference.compose(PoissonSampled(Gaussian(1.0), q), steps)
    assert result["training_epsilon"] == pytest.approx(reference.epsilon(1e-5), rel=1e-9)
    reference.compose(PoissonSampled(Gaussian(8.0), 1.0))
    assert result["combined_epsilon"] == pytest.approx(reference.epsilon(1e-5), rel=1e-9)
    # The DP-PCA event is accounted as the Gaussian mechanism with the same sampling and sigma.
    alone = make_accountant(name).compose(PoissonSampled(Gaussian(8.0), 1.0)).epsilon(1e-5)
    assert result["pca_epsilon"] == pytest.approx(alone, rel=1e-12)
    assert result["combined_epsilon"] > result["training_epsilon"]
    assert result["test_accuracy"] > 0.8  # chance is 0.1

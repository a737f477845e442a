"""Scripts in the style of each peer's README run on dpsharp with only the import line changed.

Each script below is written once, with ``{import_line}`` where the peer is imported; it is run
with dpsharp's line (always) and with the peer's own line (where the peer is installed), in
this process, and the two runs' printed numbers are compared: dpsharp's are certified and
never looser than the peer's by more than the peer's own error.
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings

import dpsharp
import pytest

DP_ACCOUNTING = (
    "import dp_accounting",
    "import dpsharp.compat.dp_accounting as dp_accounting",
    '''{import_line}

noise_multiplier, sampling_probability, steps, target_delta = 1.1, 0.01, 1000, 1e-5
event = dp_accounting.SelfComposedDpEvent(
    dp_accounting.PoissonSampledDpEvent(
        sampling_probability, dp_accounting.GaussianDpEvent(noise_multiplier)),
    steps)

rdp = dp_accounting.rdp.RdpAccountant()
rdp.compose(event)
print("rdp", rdp.get_epsilon(target_delta))

pld = dp_accounting.pld.PLDAccountant()
pld.compose(event)
print("pld", pld.get_epsilon(target_delta))
''',
)

OPACUS = (
    "from opacus import PrivacyEngine",
    "from dpsharp.torch import PrivacyEngine",
    '''import torch
{import_line}

torch.manual_seed(0)
features = torch.randn(160, 6)
dataset = torch.utils.data.TensorDataset(features, (features[:, 0] > 0).long())
data_loader = torch.utils.data.DataLoader(dataset, batch_size=16)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
criterion = torch.nn.CrossEntropyLoss()

privacy_engine = PrivacyEngine()
model, optimizer, data_loader = privacy_engine.make_private(
    module=model,
    optimizer=optimizer,
    data_loader=data_loader,
    noise_multiplier=1.1,
    max_grad_norm=1.0,
)
for epoch in range(2):
    for x, y in data_loader:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
print("epsilon", privacy_engine.get_epsilon(delta=1e-5))

model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
calibrated_engine = PrivacyEngine()
model, optimizer, data_loader = calibrated_engine.make_private_with_epsilon(
    module=model,
    optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
    data_loader=torch.utils.data.DataLoader(dataset, batch_size=16),
    target_epsilon=3.0,
    target_delta=1e-5,
    epochs=2,
    max_grad_norm=1.0,
)
for epoch in range(2):
    for x, y in data_loader:
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()
print("sigma", optimizer.noise_multiplier)
print("calibrated_epsilon", calibrated_engine.get_epsilon(delta=1e-5))
''',
)

PRV_ACCOUNTANT = (
    "import prv_accountant",
    "import dpsharp.compat.prv_accountant as prv_accountant",
    '''{import_line}
from prv_accountant.privacy_random_variables import (
    GaussianMechanism, LaplaceMechanism, PoissonSubsampledGaussianMechanism)
from prv_accountant.dpsgd import DPSGDAccountant

prv_a = PoissonSubsampledGaussianMechanism(noise_multiplier=0.8, sampling_probability=5e-3)
prv_b = GaussianMechanism(noise_multiplier=8.0)
prv_c = LaplaceMechanism(mu=0.1)
accountant = prv_accountant.PRVAccountant(
    prvs=[prv_a, prv_b, prv_c],
    max_self_compositions=[1_000, 1_000, 1_000],
    eps_error=0.1,
    delta_error=1e-10,
)
eps_low, eps_est, eps_up = accountant.compute_epsilon(
    delta=1e-6, num_self_compositions=[100, 200, 100])
print("heterogeneous", eps_low, eps_est, eps_up)

dpsgd = DPSGDAccountant(noise_multiplier=0.8, sampling_probability=5e-3, max_steps=1000,
                        eps_error=0.1, delta_error=1e-10)
eps_low, eps_estimate, eps_upper = dpsgd.compute_epsilon(delta=1e-6, num_steps=1000)
print("dpsgd", eps_low, eps_estimate, eps_upper)
''',
)

SCRIPTS = {"dp_accounting": DP_ACCOUNTING, "opacus": OPACUS, "prv_accountant": PRV_ACCOUNTANT}
NOTICES = ("Secure RNG turned off", "Full backward hook is firing", "Optimal order is the")


def script(peer: str, ours: bool) -> str:
    theirs_line, our_line, body = SCRIPTS[peer]
    source = body.format(import_line=our_line if ours else theirs_line)
    if ours and peer == "prv_accountant":  # the script's later ``from prv_accountant...`` lines
        source = source.replace("from prv_accountant.", "from dpsharp.compat.prv_accountant.")
    return source


def run(peer: str, ours: bool) -> dict[str, list[float]]:
    """Run the script; its printed ``name value ...`` lines as {name: [values]}."""
    out = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(out):
        for notice in NOTICES:  # the peers' own notices, nothing about dpsharp
            warnings.filterwarnings("ignore", message=notice)
        exec(compile(script(peer, ours), f"{peer} README-style script", "exec"),  # noqa: S102
             {"__name__": "__readme__"})
    return {line.split()[0]: [float(v) for v in line.split()[1:]]
            for line in out.getvalue().splitlines()}


def test_only_the_import_lines_differ() -> None:
    for peer in SCRIPTS:
        changed = [(a, b) for a, b in zip(script(peer, False).splitlines(),
                                          script(peer, True).splitlines()) if a != b]
        # import lines only: the peer's name in the code itself stays as it was
        assert changed and all(re.match(r"(import|from) ", a) and re.match(r"(import|from) ", b)
                                and "dpsharp" in b for a, b in changed)


def test_dp_accounting_script() -> None:
    pytest.importorskip("dp_accounting")  # the adapter forwards dp-accounting's event classes
    mine = run("dp_accounting", ours=True)
    # dp-accounting's GaussianDpEvent(s) under its default add/remove relation is dpsharp's
    # Gaussian(s): the same certified numbers as dpsharp's own accountants
    event = dpsharp.PoissonSampled(dpsharp.Gaussian(1.1), 0.01)
    assert mine["pld"] == [dpsharp.accountant("pld").compose(event, 1000).epsilon(1e-5)]
    assert mine["rdp"] == [dpsharp.accountant("rdp").compose(event, 1000).epsilon(1e-5)]
    assert mine["pld"][0] <= mine["rdp"][0]  # the tight accountant is tighter


@pytest.mark.peers
@pytest.mark.slow
def test_dp_accounting_script_agrees_with_the_peer() -> None:
    pytest.importorskip("dp_accounting")
    mine, theirs = run("dp_accounting", ours=True), run("dp_accounting", ours=False)
    # dp-accounting's PLD at its default grid is an estimate; dpsharp's certified bound is
    # within 1e-3 relative of it; RDP: the same divergences over different order grids
    assert mine["pld"][0] == pytest.approx(theirs["pld"][0], rel=1e-3)
    assert mine["rdp"][0] == pytest.approx(theirs["rdp"][0], rel=2e-2)


@pytest.mark.torch
def test_opacus_training_script() -> None:
    pytest.importorskip("torch")
    mine = run("opacus", ours=True)
    # 2 epochs of q = 16/160: 20 Poisson steps at sigma 1.1 on the tight accountant
    expected = dpsharp.accountant("pld").compose(
        dpsharp.PoissonSampled(dpsharp.Gaussian(1.1), 0.1), 20).epsilon(1e-5)
    assert mine["epsilon"][0] == expected
    assert 3.0 * (1 - 2e-3) <= mine["calibrated_epsilon"][0] <= 3.0


@pytest.mark.peers
@pytest.mark.torch
@pytest.mark.slow
def test_opacus_training_script_agrees_with_the_peer() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("opacus")
    mine, theirs = run("opacus", ours=True), run("opacus", ours=False)
    # Opacus' default PRV accountant (eps_error 0.01) on the same steps
    assert mine["epsilon"][0] == pytest.approx(theirs["epsilon"][0], abs=0.02)
    assert mine["sigma"][0] == pytest.approx(theirs["sigma"][0], rel=0.02)


def test_prv_accountant_script() -> None:
    mine = run("prv_accountant", ours=True)
    for name in ("heterogeneous", "dpsgd"):
        low, estimate, high = mine[name]
        assert low <= estimate <= high <= low + 2 * 0.1
    # the same certified upper bound as dpsharp's PLD accountant at a precision of 2 eps_error
    # or finer (prv-accountant's eps_error sets its mesh; the bracket must be <= 2 eps_error)
    exact = [dpsharp.accountant("pld", precision=p).compose(
        dpsharp.PoissonSampled(dpsharp.Gaussian(0.8), 5e-3), 1000).epsilon(1e-6)
        for p in (0.2, 0.1, 0.05, 0.025)]
    assert mine["dpsgd"][2] in exact


@pytest.mark.peers
@pytest.mark.slow
def test_prv_accountant_script_agrees_with_the_peer() -> None:
    pytest.importorskip("prv_accountant")
    mine, theirs = run("prv_accountant", ours=True), run("prv_accountant", ours=False)
    for name in ("heterogeneous", "dpsgd"):
        # both brackets hold the optimal epsilon: they overlap
        assert mine[name][0] <= theirs[name][2] and theirs[name][0] <= mine[name][2]

"""The ``dpsharp`` command: its statements equal the Python API, its JSON keeps the documented
schema, usage errors are one line with exit status 2, and its plots hold the accountants'
numbers (read back from the figure objects, not from pixels)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import dpsharp
import pytest
from dpsharp.cli import main

MNIST = [
    "--dataset-size", "60000", "--batch-size", "256", "--epochs", "60",
    "--noise-multiplier", "1.1", "--delta", "1e-5",
]
MNIST_STEPS = math.ceil(60 * 60000 / 256)  # TF Privacy's step count (14063)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def api_guarantee(name: str, event: dpsharp.Event, count: int, delta: float, **options: object):
    acc = dpsharp.accountant(name, **options)
    if not acc.supports(event):
        return acc, None
    return acc, acc.compose(event, count).guarantee(delta)


def test_every_family_is_reachable_by_name() -> None:
    names = dpsharp.available()
    assert len(names) == len(set(names))
    for name in names:
        acc = dpsharp.accountant(name)
        assert isinstance(acc, dpsharp.Accountant) and acc.name == name
        assert type(acc).__doc__, f"{name} has no docstring"
    with pytest.raises(ValueError, match="accountant name must be one of"):
        dpsharp.accountant("no-such-accountant")


def test_epsilon_json_equals_python_api_for_every_accountant(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_cli(capsys, "epsilon", *MNIST, "--accountant", "all", "--json")
    assert status == 0, err
    document = json.loads(out)
    inputs = document["inputs"]
    assert inputs["steps"] == MNIST_STEPS == 14063
    assert inputs["sampling"] == "poisson" and inputs["neighbouring"] == "add_remove"
    event = dpsharp.PoissonSampled(dpsharp.Gaussian(1.1), 256 / 60000)
    assert dpsharp.events.event_from_dict(inputs["event"]) == event
    assert set(document["accountants"]) == set(dpsharp.available())
    for name, fields in document["accountants"].items():
        if not fields["applicable"]:
            assert fields["reason"] and not dpsharp.accountant(name).supports(event)
            continue
        _, guarantee = api_guarantee(name, event, MNIST_STEPS, 1e-5, **fields["options"])
        assert guarantee is not None
        assert fields["applicable"] is True
        assert fields["epsilon"] == guarantee.epsilon, name
        assert fields["certified"] is guarantee.certified
        assert fields["epsilon_lower"] == guarantee.epsilon_lower
        assert fields["warning"] == guarantee.warning
    accountants = document["accountants"]
    if "gdp" in accountants:
        # Bu et al. 2020: MNIST, sigma 1.1, 60 epochs -> mu_CLT 0.574, eps 2.324.
        assert accountants["gdp"]["certified"] is False
        assert accountants["gdp"]["mu"] == pytest.approx(0.574, abs=6e-4)
        assert accountants["gdp"]["epsilon"] == pytest.approx(2.324, abs=2e-3)
    if "pld" in accountants:
        pld = accountants["pld"]
        assert pld["certified"] is True
        assert pld["epsilon_lower"] <= pld["epsilon"]
        assert pld["gdp_mu"] > 0
    if "rdp" in accountants:
        assert accountants["rdp"]["order"] > 1
        if "pld" in accountants:  # the tight certified bound is below the RDP bound
            assert accountants["pld"]["epsilon"] <= accountants["rdp"]["epsilon"]


def test_text_statement_states_assumption_and_labels(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(capsys, "epsilon", *MNIST)
    assert status == 0
    assert "Poisson sampling" in out and "q = 256/60000" in out and "14063 steps" in out
    assert "adding or removing one example" in out
    for name in dpsharp.available():
        assert f"  {name} " in out
    if "gdp" in dpsharp.available():
        assert "approximation" in out and "central-limit mu = 0.57" in out


def test_shuffle_sampling_uses_epoch_events_and_reports_inapplicable(capsys: pytest.CaptureFixture[str]) -> None:
    # Yu et al. 2019: q = 0.01, sigma = 6, 400 epochs of reshuffling:
    # rho = 400 / (2 * 36), and the simple conversion rho + 2 sqrt(rho log(1/delta)) = 21.551.
    argv = ["epsilon", "--dataset-size", "10000", "--batch-size", "100", "--epochs", "400",
            "--noise-multiplier", "6", "--delta", "1e-5", "--sampling", "shuffle", "--json"]
    status, out, err = run_cli(capsys, *argv)
    assert status == 0, err
    document = json.loads(out)
    assert document["inputs"]["count"] == 400
    # reshuffling is stated under zero-out (no add/remove guarantee), with the same event
    assert document["inputs"]["neighbouring"] == "zero_out"
    assert "not an add/remove guarantee" in document["inputs"]["assumption"]
    event = dpsharp.Shuffled(dpsharp.Gaussian(6.0), 100, 10000)
    assert dpsharp.events.event_from_dict(document["inputs"]["event"]) == event
    for name, fields in document["accountants"].items():
        if not fields["applicable"]:
            assert "Shuffled" in fields["reason"]
            continue
        _, guarantee = api_guarantee(name, event, 400, 1e-5, **fields["options"])
        assert guarantee is not None and fields["epsilon"] == guarantee.epsilon
    zcdp = document["accountants"].get("zcdp")
    if zcdp is not None:
        assert zcdp["rho"] == pytest.approx(400 / 72, rel=1e-12)
        assert zcdp["epsilon"] <= 21.551 + 1e-3
        rho = 400 / 72
        assert rho + 2 * math.sqrt(rho * math.log(1e5)) == pytest.approx(21.551, abs=1e-3)
    assert any(not fields["applicable"] for fields in document["accountants"].values())


def test_fixed_sampling_is_replace_one_with_half_noise_multiplier(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["epsilon", "--dataset-size", "1000", "--batch-size", "50", "--steps", "200",
            "--noise-multiplier", "2.0", "--delta", "1e-6", "--sampling", "fixed", "--json"]
    status, out, err = run_cli(capsys, *argv)
    assert status == 0, err
    document = json.loads(out)
    assert document["inputs"]["neighbouring"] == "replace_one"
    event = dpsharp.events.event_from_dict(document["inputs"]["event"])
    # The clipped sum's sensitivity is 2C under replace one: Gaussian(sigma / 2).
    assert event == dpsharp.SampledWithoutReplacement(dpsharp.Gaussian(1.0), 50, 1000)
    assert "sensitivity 2C" in document["inputs"]["assumption"]
    for name, fields in document["accountants"].items():
        if not fields["applicable"]:
            assert fields["reason"]
            continue
        assert fields["options"].get("neighbouring", "replace_one") == "replace_one"
        _, guarantee = api_guarantee(name, event, 200, 1e-6, **fields["options"])
        assert guarantee is not None and fields["epsilon"] == guarantee.epsilon
        assert fields["neighbouring"] == "replace_one"


def test_steps_flag_and_accountant_selection(capsys: pytest.CaptureFixture[str]) -> None:
    name = dpsharp.available()[0]
    status, out, _ = run_cli(capsys, "epsilon", "--dataset-size", "1000", "--batch-size", "10",
                             "--steps", "500", "--noise-multiplier", "1.0", "--delta", "1e-5",
                             "--accountant", name, "--json")
    assert status == 0
    document = json.loads(out)
    assert list(document["accountants"]) == [name]
    assert document["inputs"]["steps"] == 500 and document["inputs"]["epochs"] == 5.0


USAGE_ERRORS = [
    (["epsilon", *MNIST[:-2], "--delta", "1.5"], "--delta"),
    (["epsilon", *MNIST[:-2], "--delta", "nan"], "--delta"),
    (["epsilon", *MNIST[:-2], "--delta", "abc"], "--delta"),
    (["epsilon", "--dataset-size", "100", "--batch-size", "200", "--steps", "3",
      "--noise-multiplier", "1", "--delta", "1e-5"], "--batch-size"),
    (["epsilon", "--dataset-size", "-5", "--batch-size", "2", "--steps", "3",
      "--noise-multiplier", "1", "--delta", "1e-5"], "--dataset-size"),
    (["epsilon", "--dataset-size", "100", "--batch-size", "2", "--steps", "3",
      "--noise-multiplier", "0", "--delta", "1e-5"], "--noise-multiplier"),
    (["epsilon", "--dataset-size", "100", "--batch-size", "2", "--steps", "3",
      "--noise-multiplier", "inf", "--delta", "1e-5"], "--noise-multiplier"),
    (["epsilon", "--dataset-size", "100", "--batch-size", "2", "--steps", "3", "--epochs", "2",
      "--noise-multiplier", "1", "--delta", "1e-5"], "--epochs"),
    (["epsilon", "--dataset-size", "100", "--batch-size", "2",
      "--noise-multiplier", "1", "--delta", "1e-5"], "--epochs"),
    (["epsilon", "--dataset-size", "100", "--batch-size", "2", "--steps", "1.5",
      "--noise-multiplier", "1", "--delta", "1e-5"], "--steps"),
    (["epsilon", *MNIST, "--sampling", "uniform"], "--sampling"),
    (["epsilon", *MNIST, "--accountant", "nope"], "--accountant"),
    (["epsilon", *MNIST, "--accountant", "all", "gdp"], "--accountant"),
    (["calibrate", "--target-epsilon", "-1", "--dataset-size", "100", "--batch-size", "2",
      "--steps", "3", "--delta", "1e-5"], "--target-epsilon"),
    (["curve", *MNIST], "--output"),
    (["frobnicate"], "COMMAND"),
    # the sampling rate: q in (0, 1], instead of the sizes, Poisson only
    (["epsilon", "--sample-rate", "0.01", "--dataset-size", "100", "--steps", "3",
      "--noise-multiplier", "1", "--delta", "1e-5"], "--sample-rate"),
    (["epsilon", "--sample-rate", "0.01", "--batch-size", "10", "--steps", "3",
      "--noise-multiplier", "1", "--delta", "1e-5"], "--sample-rate"),
    (["epsilon", "--sample-rate", "0", "--steps", "3", "--noise-multiplier", "1",
      "--delta", "1e-5"], "--sample-rate"),
    (["epsilon", "--sample-rate", "1.5", "--steps", "3", "--noise-multiplier", "1",
      "--delta", "1e-5"], "--sample-rate"),
    (["epsilon", "--sample-rate", "nan", "--steps", "3", "--noise-multiplier", "1",
      "--delta", "1e-5"], "--sample-rate"),
    (["epsilon", "--sample-rate", "1/0", "--steps", "3", "--noise-multiplier", "1",
      "--delta", "1e-5"], "--sample-rate"),
    (["epsilon", "--sample-rate", "0.01", "--steps", "3", "--noise-multiplier", "1",
      "--delta", "1e-5", "--sampling", "shuffle"], "--sample-rate"),
    (["epsilon", "--steps", "3", "--noise-multiplier", "1", "--delta", "1e-5"],
     "--dataset-size"),
    (["epsilon", "--dataset-size", "100", "--steps", "3", "--noise-multiplier", "1",
      "--delta", "1e-5"], "--batch-size"),
    (["calibrate", "--target-epsilon", "1", "--sample-rate", "2", "--steps", "3",
      "--delta", "1e-5"], "--sample-rate"),
    # paths: a missing folder, a folder where a file is wanted, a missing input file
    (["curve", *MNIST, "--output", "/nonexistent/dir/c.png"], "--output"),
    (["curve", *MNIST, "--output", "/"], "--output"),
    (["epsilon", *MNIST, "--plot", "/nonexistent/dir/e.png"], "--plot"),
    (["epsilon", *MNIST, "--plot-classic"], "--plot-classic"),
    (["audit", "--plot", "/nonexistent/dir/a.png"], "--plot"),
    (["bench", "precision", "--grid", "/nonexistent/grid.json"], "--grid"),
    (["bench", "precision", "--grid", "/"], "--grid"),
    (["bench", "precision", "--output", "/proc/version"], "--output"),
    (["bench", "speed", "--output", "/proc/version/dir"], "--output"),
    (["demo", "--output", "/proc/version"], "--output"),
    # counts past 2^53, rates below the smallest normal double, the audit's and demo's flags
    # named as flags (they were named as the API's arguments, or not at all)
    (["curve", "--dataset-size", "60000", "--batch-size", "256", "--steps",
      "99999999999999999999", "--noise-multiplier", "1.1", "--delta", "1e-5", "--output",
      "c.png"], "--steps"),
    (["epsilon", "--sample-rate", "1e-400", "--steps", "10", "--noise-multiplier", "1",
      "--delta", "1e-5"], "--sample-rate"),
    (["audit", "--sample-rate", "1.5"], "--sample-rate"),
    (["audit", "--noise-multiplier", "-1"], "--noise-multiplier"),
    (["audit", "--confidence", "1"], "--confidence"),
    (["audit", "--seed", "-1"], "--seed"),
    (["audit", "--canaries", "1"], "--canaries"),
    (["demo", "--seed", "-1"], "--seed"),
    (["epsilon", *MNIST, "--plot", "e.txtz"], "--plot"),
    (["curve", *MNIST, "--output", "c.txtz"], "--output"),
    (["audit", "--plot", "a.txtz"], "--plot"),
    (["calibrate", "--accountant", "all", "--target-epsilon", "3", "--dataset-size", "60000",
      "--batch-size", "256", "--epochs", "60", "--delta", "1e-5"], "--accountant"),
]


@pytest.mark.parametrize(
    "content",
    ['[{"q": 0.01, "sigma": 1.0, "steps": 10', "[]", '[{"q": 0.01}]', "\xff\xfe"],
    ids=["truncated", "empty", "no-sigma", "not-text"],
)
def test_bad_grid_file_is_one_line_exit_2(
    content: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = tmp_path / "grid.json"
    grid.write_bytes(content.encode("latin-1"))
    status, out, err = run_cli(capsys, "bench", "precision", "--no-peers", "--grid", str(grid))
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "--grid" in err and "Traceback" not in err


def test_unwritable_output_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """A file that cannot be written after the flags were checked (here /proc, where nothing
    can be created) is one line and status 2, not a traceback."""
    pytest.importorskip("matplotlib")
    status, out, err = run_cli(capsys, "epsilon", "--sample-rate", "0.01", "--steps", "10",
                               "--noise-multiplier", "1", "--delta", "1e-5", "--accountant",
                               "rdp", "--plot", "/proc/e.png")
    assert status == 2
    assert len(err.strip().splitlines()) == 1 and "/proc/e.png" in err


@pytest.mark.parametrize(("argv", "flag"), USAGE_ERRORS)
def test_usage_errors_are_one_line_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as excinfo:
        main(argv)
    assert excinfo.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert flag in lines[0] and "error" in lines[0]


def test_module_and_console_script_run(tmp_path: Path) -> None:
    argv = ["epsilon", "--dataset-size", "1000", "--batch-size", "10", "--steps", "100",
            "--noise-multiplier", "1.0", "--delta", "1e-5", "--json"]
    result = subprocess.run([sys.executable, "-m", "dpsharp", *argv], check=False, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["inputs"]["steps"] == 100
    bad = subprocess.run([sys.executable, "-m", "dpsharp", "epsilon", "--delta", "2"],
                         check=False, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    script = Path(sys.executable).with_name("dpsharp")
    if script.exists():
        result = subprocess.run([str(script), *argv], check=False, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0 and json.loads(result.stdout)["inputs"]["steps"] == 100


def test_accountants_listing(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_cli(capsys, "accountants")
    assert status == 0
    assert [line.split()[0] for line in out.strip().splitlines()] == dpsharp.available()


def test_accountants_listing_labels_each_scheme_and_prints_whole_sentences(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each line says, per sampling scheme, whether the accountant's answer for a DP-SGD run is
    certified, read here from the guarantee the API returns for the same events; zcdp with
    Poisson sampling is Yu et al. 2019's empirical approximation, not a certified bound (it was
    listed as "(certified)"). Descriptions are whole sentences of the class docstring (the
    moments accountant's was cut at "... summed over steps, and")."""
    from dpsharp._dpsgd import DPSGDRun

    status, out, _ = run_cli(capsys, "accountants")
    assert status == 0
    lines = {line.split()[0]: line for line in out.strip().splitlines()}
    for name, line in lines.items():
        labels, _, description = line.partition("]: ")
        for sampling in ("poisson", "shuffle", "fixed"):
            run = DPSGDRun(1000, 10, 100, 1.0, sampling)
            try:
                acc = dpsharp.accountant(name, **run.accountant_options(name))
            except (TypeError, ValueError):
                acc = None
            if acc is None or not acc.supports(run.event):
                assert f"{sampling} not applicable" in labels, (name, sampling)
                continue
            certified = acc.compose(run.event, run.count).guarantee(1e-5).certified
            kind = "certified" if certified else "approximation"
            assert f"{sampling} {kind}" in labels, (name, sampling)
        assert description.endswith(".") and not description.endswith(", and.")
        doc = " ".join((type(dpsharp.accountant(name)).__doc__ or "").split())
        assert description[:-1] in doc, name
    if "zcdp" in lines:
        assert "poisson approximation" in lines["zcdp"]
        assert "shuffle certified" in lines["zcdp"]
    if "moments" in lines:
        assert "Abadi et al. 2016" in lines["moments"]


# ---------------------------------------------------------------------------- start-up, flags
def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as excinfo:
        main(["--version"])
    assert excinfo.value.code == 0
    assert capsys.readouterr().out.strip() == f"dpsharp {dpsharp.__version__}"


def test_start_up_help_and_usage_errors_import_no_scipy() -> None:
    """--help and usage errors must answer without the seconds scipy takes to import: the
    command imports numpy, scipy and the accountants inside the sub-commands only."""
    script = (
        "import sys\n"
        "import dpsharp.cli\n"
        "print(sorted(m for m in ('scipy', 'numpy', 'dpsharp.accountants') if m in sys.modules))\n"
        "for argv in (['--help'], ['epsilon', '--help'], ['epsilon', '--delta', '2'],\n"
        "             ['curve', '--sample-rate', '0.1', '--steps', '3',\n"
        "              '--noise-multiplier', '1',\n"
        "              '--delta', '1e-5', '--output', '/nonexistent/dir/c.png']):\n"
        "    try:\n"
        "        dpsharp.cli.main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "print(sorted(m for m in ('scipy', 'numpy', 'dpsharp.accountants') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "[]" and lines[-1] == "[]", result.stdout


def _all_actions(parser: object) -> list[tuple[str, object]]:
    import argparse

    found = []
    for action in parser._actions:  # type: ignore[attr-defined]
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [(f"{name} {where}", a) for where, a in _all_actions(sub)]
        else:
            found.append((parser.prog, action))  # type: ignore[attr-defined]
    return found


def test_every_flag_has_help_text() -> None:
    from dpsharp.cli import _build_parser

    actions = _all_actions(_build_parser())
    assert len(actions) > 40
    for where, action in actions:
        assert action.help and action.help.strip(), (where, action.option_strings)
    options = {s for _, a in actions for s in a.option_strings}
    assert {"--version", "--sample-rate", "--plot-classic", "--target-epsilon"} <= options


def test_sample_rate_flag_states_the_same_run_as_the_sizes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--sample-rate Q is q itself: the event's q is the float of the text, the numbers are the
    API's for PoissonSampled(Gaussian(sigma), q), and --epochs E means ceil(E / q) steps."""
    status, out, err = run_cli(capsys, "epsilon", "--sample-rate", "0.004266", "--epochs", "3",
                               "--noise-multiplier", "1.1", "--delta", "1e-5", "--json")
    assert status == 0, err
    document = json.loads(out)
    inputs = document["inputs"]
    assert inputs["dataset_size"] is None and inputs["batch_size"] is None
    assert inputs["sampling_probability"] == 0.004266
    assert inputs["steps"] == math.ceil(3 / 0.004266) == 704
    event = dpsharp.PoissonSampled(dpsharp.Gaussian(1.1), 0.004266)
    assert dpsharp.events.event_from_dict(inputs["event"]) == event
    assert "0.004266" in inputs["assumption"] and "2133" not in inputs["assumption"]
    for name, fields in document["accountants"].items():
        _, guarantee = api_guarantee(name, event, 704, 1e-5, **fields["options"])
        if guarantee is not None:
            assert fields["epsilon"] == guarantee.epsilon, name
    # a fraction spells q exactly: 256/60000 is the MNIST run of --dataset-size/--batch-size
    status, by_rate, _ = run_cli(capsys, "epsilon", "--sample-rate", "256/60000", *MNIST[4:],
                                 "--json")
    status_sizes, by_sizes, _ = run_cli(capsys, "epsilon", *MNIST, "--json")
    assert status == status_sizes == 0
    rate, sizes = json.loads(by_rate), json.loads(by_sizes)
    assert rate["inputs"]["event"] == sizes["inputs"]["event"]
    assert rate["inputs"]["steps"] == sizes["inputs"]["steps"] == MNIST_STEPS
    assert rate["accountants"] == sizes["accountants"]
    status, text, _ = run_cli(capsys, "epsilon", "--sample-rate", "0.01", "--steps", "10",
                              "--noise-multiplier", "1", "--delta", "1e-5", "--accountant", "rdp")
    assert status == 0 and "Poisson sampling rate q = 0.01, 10 steps" in text


# ---------------------------------------------------------------------------- plots
def test_epsilon_plot_is_written_and_holds_each_accountants_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "eps.png"
    argv = ["epsilon", "--dataset-size", "10000", "--batch-size", "100", "--epochs", "20",
            "--noise-multiplier", "1.0", "--delta", "1e-5", "--json", "--plot", str(path)]
    status, out, err = run_cli(capsys, *argv)
    assert status == 0, err
    assert path.stat().st_size > 1000 and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    plot = json.loads(out)["plot"]
    applicable = [n for n, f in json.loads(out)["accountants"].items() if f["applicable"]]
    # the classic bound is drawn only with --plot-classic
    assert sorted(plot["epsilon"]) == sorted(n for n in applicable if n != "classic")
    status, with_classic, _ = run_cli(capsys, *argv, "--plot-classic")
    assert status == 0
    assert sorted(json.loads(with_classic)["plot"]["epsilon"]) == sorted(applicable)
    applicable = [n for n in applicable if n != "classic"]
    for name in applicable:
        epochs, epsilons = plot["epochs"][name], plot["epsilon"][name]
        assert epochs[-1] == pytest.approx(20.0) and len(epochs) == len(epsilons) == 40
        for x, y in list(zip(epochs, epsilons))[::13] + [(epochs[-1], epsilons[-1])]:
            steps = round(x * 10000 / 100)
            options = json.loads(out)["accountants"][name]["options"]
            fresh = dpsharp.accountant(name, **options).compose(
                dpsharp.PoissonSampled(dpsharp.Gaussian(1.0), 0.01), steps)
            assert y == pytest.approx(fresh.epsilon(1e-5), rel=1e-9, abs=1e-12), (name, x)


def test_plot_functions_return_figures_with_the_accountant_data(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from dpsharp import plots
    from dpsharp._dpsgd import DPSGDRun
    from dpsharp._report import epsilon_series

    run = DPSGDRun(5000, 50, 1000, 0.9)
    series = {}
    for name in dpsharp.available():
        data = epsilon_series(run, name, 1e-5, points=10)
        if data is not None:
            series[name] = data
    figure = plots.epsilon_vs_epochs(series, delta=1e-5, path=tmp_path / "e.png")
    lines = {line.get_gid(): line for line in figure.axes[0].get_lines()}
    assert set(lines) == set(series)
    for name, line in lines.items():
        xs, ys = line.get_xdata(), line.get_ydata()
        assert list(xs) == pytest.approx([k * 100 * 50 / 5000 for k in range(1, 11)])
        for x, y in zip(xs, ys):
            fresh = dpsharp.accountant(name, **run.accountant_options(name))
            fresh.compose(run.event, round(x * 5000 / 50))
            assert y == pytest.approx(fresh.epsilon(1e-5), rel=1e-9, abs=1e-12)
    assert (tmp_path / "e.png").stat().st_size > 1000


def test_curve_plot_holds_tradeoff_curves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    if "pld" not in dpsharp.available():
        pytest.skip("the pld accountant is not built in this checkout")
    import numpy as np
    from dpsharp import tradeoff
    from dpsharp._dpsgd import DPSGDRun
    from dpsharp._report import tradeoff_data

    path = tmp_path / "curve.png"
    argv = ["curve", "--dataset-size", "60000", "--batch-size", "256", "--epochs", "15",
            "--noise-multiplier", "1.1", "--delta", "1e-5", "--output", str(path), "--json"]
    status, out, err = run_cli(capsys, *argv)
    assert status == 0, err
    assert path.stat().st_size > 1000
    document = json.loads(out)
    run = DPSGDRun(60000, 256, math.ceil(15 * 60000 / 256), 1.1)
    pld = dpsharp.accountant("pld").compose(run.event, run.count)
    alphas = np.asarray(document["curves"]["alpha"])
    assert document["gdp_mu_certified"] == pld.gdp_mu()
    assert np.array_equal(document["curves"]["pld"], pld.tradeoff(alphas))
    # a subsampled run is mu-GDP only for mu >= sqrt(T)/sigma: that G_mu is not drawn
    assert document["gdp_mu_certified"] == pytest.approx(math.sqrt(run.count) / 1.1, rel=1e-12)
    assert document["gdp_mu_informative"] is False and "gdp_certified" not in document["curves"]
    assert np.allclose(document["curves"]["gdp_clt"],
                       tradeoff.gaussian_tradeoff(alphas, document["gdp_mu_clt"]), rtol=0, atol=1e-15)
    data = tradeoff_data(run, 1e-5, alphas)
    from dpsharp import plots

    figure = plots.tradeoff_curves({"pld": data["pld"], "g": data["gdp_clt"]}, alphas=alphas)
    lines = {line.get_gid(): line for line in figure.axes[0].get_lines()}
    assert np.array_equal(lines["pld"].get_ydata(), pld.tradeoff(alphas))
    assert np.array_equal(lines["pld"].get_xdata(), alphas)


def test_missing_matplotlib_is_a_clear_one_line_error(tmp_path: Path) -> None:
    script = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'matplotlib' or name.startswith('matplotlib.'):\n"
        "            raise ImportError('blocked for the test')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from dpsharp.cli import main\n"
        f"sys.exit(main(['epsilon', '--dataset-size', '100', '--batch-size', '10', '--steps', '5',"
        f" '--noise-multiplier', '1', '--delta', '1e-5', '--plot', {str(tmp_path / 'x.png')!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True,
                            timeout=120, env={**os.environ})
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "--plot" in result.stderr and "matplotlib" in result.stderr and "pip install" in result.stderr
    assert not (tmp_path / "x.png").exists()


# ---------------------------------------------------------------------------- calibrate
def certified_names(run: object, delta: float) -> list[str]:
    """Accountants that analyse ``run`` and report a certified bound for it."""
    names = []
    for name in dpsharp.available():
        try:
            acc = dpsharp.accountant(name, **run.accountant_options(name))  # type: ignore[attr-defined]
        except TypeError:
            continue
        if acc.supports(run.event) and acc.compose(run.event, run.count).guarantee(delta).certified:  # type: ignore[attr-defined]
            names.append(name)
    return names


@pytest.mark.parametrize("sampling", ["poisson", "shuffle", "fixed"])
def test_calibrate_matches_api_and_is_conservative(sampling: str, capsys: pytest.CaptureFixture[str]) -> None:
    from dpsharp._dpsgd import DPSGDRun

    certified = certified_names(DPSGDRun(20000, 200, 2000, 1.0, sampling), 1e-5)
    if not certified:
        pytest.skip(f"no certified accountant analyses {sampling} sampling in this checkout")
    name = certified[0]
    target, delta = 2.0, 1e-5
    argv = ["calibrate", "--target-epsilon", str(target), "--delta", str(delta), "--steps", "2000",
            "--dataset-size", "20000", "--batch-size", "200", "--sampling", sampling,
            "--accountant", name, "--json"]
    status, out, err = run_cli(capsys, *argv)
    assert status == 0, err
    document = json.loads(out)
    sigma = document["noise_multiplier"]
    run = DPSGDRun(20000, 200, 2000, 1.0, sampling)
    api_sigma = dpsharp.calibrate.noise_multiplier(
        target, delta, steps=run.count,
        accountant=lambda: dpsharp.accountant(name, **run.accountant_options(name)),
        event=lambda s, _q: run.event_for(s),
    )
    assert sigma == api_sigma
    achieved = dpsharp.accountant(name, **run.accountant_options(name)).compose(
        run.event_for(sigma), run.count).epsilon(delta)
    assert document["epsilon"] == achieved
    assert target * (1 - 1e-3) <= achieved <= target  # conservative and tight
    # a slightly smaller noise multiplier would break the target: the answer is not wasteful
    looser = dpsharp.accountant(name, **run.accountant_options(name)).compose(
        run.event_for(sigma * 0.99), run.count).epsilon(delta)
    assert looser > achieved


def test_calibrate_text_and_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["calibrate", "--target-epsilon", "3", "--delta", "1e-5", "--epochs", "10",
            "--dataset-size", "60000", "--batch-size", "256"]
    if "gdp" in dpsharp.available():
        status, _, err = run_cli(capsys, *base, "--accountant", "gdp")
        assert status == 2 and "--allow-approximation" in err and len(err.strip().splitlines()) == 1
        status, out, _ = run_cli(capsys, *base, "--accountant", "gdp", "--allow-approximation")
        assert status == 0 and "approximation" in out and "noise multiplier = " in out
    from dpsharp._dpsgd import DPSGDRun

    name = certified_names(DPSGDRun(100, 100, 10, 1.0), 1e-5)[0]
    status, _, err = run_cli(capsys, "calibrate", "--target-epsilon", "1e-9", "--delta", "1e-12",
                             "--steps", "100000", "--dataset-size", "100", "--batch-size", "100",
                             "--accountant", name)
    assert status == 2 and "unreachable" in err and len(err.strip().splitlines()) == 1


def test_calibrate_zcdp_random_sampling_needs_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """Poisson sampling makes the zcdp accountant ZCDPAccountant(batching="sample"), whose
    epsilon is an approximation (Yu et al. 2019's empirical P): calibrating on it used to pass
    without --allow-approximation because the flag was read from the accountant's class."""
    # (target 1: the calibrated sigma, 1.45, is inside the range of Yu et al.'s P, sigma >= 1)
    base = ["calibrate", "--target-epsilon", "1", "--delta", "1e-5", "--epochs", "10",
            "--dataset-size", "60000", "--batch-size", "256", "--accountant", "zcdp"]
    status, out, err = run_cli(capsys, *base)
    assert status == 2 and out == ""
    assert "approximate" in err and "--allow-approximation" in err
    assert len(err.strip().splitlines()) == 1
    status, out, _ = run_cli(capsys, *base, "--allow-approximation", "--json")
    document = json.loads(out)
    assert status == 0 and document["certified"] is False
    assert document["accountant"]["certified"] is False and document["accountant"]["warning"]
    status, out, _ = run_cli(capsys, *base, "--allow-approximation")
    assert status == 0 and "approximation" in out


# ---------------------------------------------------------------------------- plot styles
def test_epsilon_plot_scale_follows_the_spread_of_the_curves() -> None:
    """A bound orders of magnitude above the others (classic composition: 1303 against 2.4 for
    60 epochs of MNIST) turns the axis logarithmic, so the others are not pressed into a band
    near 0; curves of one magnitude keep a linear axis."""
    pytest.importorskip("matplotlib")
    from dpsharp import plots

    xs = [1.0, 2.0, 3.0]
    close = {"pld": (xs, [1.0, 1.6, 2.1]), "rdp": (xs, [1.2, 1.8, 2.4])}
    figure = plots.epsilon_vs_epochs(close, delta=1e-5)
    assert figure.axes[0].get_yscale() == "linear"
    spread = {**close, "classic": (xs, [100.0, 400.0, 1303.0])}
    figure = plots.epsilon_vs_epochs(spread, delta=1e-5)
    assert figure.axes[0].get_yscale() == "log"
    assert 2.4 / 1.0 < plots.LOG_SCALE_RATIO < 1303.0 / 2.1
    figure = plots.epsilon_vs_epochs(spread, delta=1e-5, yscale="linear")
    assert figure.axes[0].get_yscale() == "linear"
    with pytest.raises(ValueError, match="yscale"):
        plots.epsilon_vs_epochs(close, delta=1e-5, yscale="symlog")


def test_tradeoff_figure_says_which_curve_it_leaves_out(tmp_path: Path) -> None:
    """For a Poisson-subsampled run the certified GDP mu is sqrt(T)/sigma (closed form: the
    event that every step samples the record), 35.2 for 1500 steps at sigma 1.1: its G_mu lies
    on the axes and is not drawn; the legend says so with the value instead."""
    pytest.importorskip("matplotlib")
    if "pld" not in dpsharp.available():
        pytest.skip("the pld accountant is not built in this checkout")
    from dpsharp import plots
    from dpsharp._dpsgd import DPSGDRun
    from dpsharp._report import write_tradeoff_figure

    captured = {}
    original = plots.tradeoff_curves

    def spy(*args: object, **kwargs: object) -> object:
        captured["figure"] = original(*args, **kwargs)  # type: ignore[arg-type]
        return captured["figure"]

    plots.tradeoff_curves = spy  # type: ignore[assignment]
    try:
        data = write_tradeoff_figure(DPSGDRun(60000, 256, 1500, 1.1), 1e-5, tmp_path / "t.png")
    finally:
        plots.tradeoff_curves = original  # type: ignore[assignment]
    mu = math.sqrt(1500) / 1.1
    assert data["gdp_mu_certified"] == pytest.approx(mu, rel=1e-12)
    axes = captured["figure"].axes[0]
    drawn = [line for line in axes.get_lines() if len(line.get_xdata())]
    assert not any("certified mu" in line.get_label() for line in drawn)
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    # a certified mu is printed rounded up (35.208... at 3 significant digits: 35.3)
    shown = f"{math.ceil(mu * 10) / 10:.3g}"
    assert any("not drawn" in text and f"mu = {shown} " in text for text in legend), legend

    # without sampling, 10 steps at sigma 2 are exactly G_mu, mu = sqrt(10)/2 (drawn), and the
    # (epsilon, delta) curves have epsilon > 7: their corner alpha = beta = (1 - delta) /
    # (1 + e^epsilon) < 6e-4 lies on the axes, so they are named, not drawn
    plots.tradeoff_curves = spy  # type: ignore[assignment]
    try:
        data = write_tradeoff_figure(DPSGDRun(100, 100, 10, 2.0), 1e-5, tmp_path / "q1.png")
    finally:
        plots.tradeoff_curves = original  # type: ignore[assignment]
    axes = captured["figure"].axes[0]
    drawn = [line.get_label() for line in axes.get_lines() if len(line.get_xdata())]
    # mu = sqrt(10)/2 = 1.5811..., printed rounded up at 3 significant digits
    shown = f"{math.ceil(math.sqrt(10) / 2 * 100) / 100:.3g}"
    assert shown == "1.59" and any(f"certified mu = {shown}" in label for label in drawn)
    corner = (1 - 1e-5) / (1 + math.exp(data["epsilon_pld"]))
    assert data["epsilon_pld"] > 7 and corner < 6e-4
    assert not any("-DP" in label for label in drawn)
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert sum("-DP" in text and "not drawn, on the axes" in text for text in legend) == 2


def test_precision_figure_gives_every_series_its_own_colour_and_marker() -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.colors import to_hex

    from dpsharp.bench import precision

    names = [f"library{i}.accountant" for i in range(12)]
    rows = [{"accountant": name, "setting": "s", "gap": 0.0, "epsilon": 1.0 + i / 10,
             "tightest_certified_upper": 1.0, "seconds": 0.01 * (i + 1)}
            for i, name in enumerate(names)]
    rows[-1]["epsilon"] = 1303.0  # a bound far off the scale is drawn at the edge, labelled
    figure = precision.precision_figure({"settings": [{"name": "s"}], "rows": rows})
    left = figure.axes[0]
    styles = set()
    for collection in left.collections:
        colour = to_hex(collection.get_facecolor()[0])
        path = collection.get_paths()[0]
        styles.add((colour, path.vertices.tobytes()))
    assert len(left.collections) == 12
    assert len({colour for colour, _ in styles}) == 12  # 12 distinct colours (tab10 repeats)
    assert left.get_xlim()[1] < 1303.0
    labels = [text.get_text() for text in figure.axes[1].get_legend().get_texts()]
    assert any("off scale" in label and "1.3e+03" in label for label in labels)


def test_speed_figure_legend_hides_no_point() -> None:
    """The legend sits outside both axes: its box overlaps neither (inside, it hid a point)."""
    pytest.importorskip("matplotlib")
    from dpsharp.bench import speed

    record = {"median": 0.01, "min": 0.01, "max": 0.01, "repeats": 1, "epsilon": 1.0}
    names = [f"contender{i}" for i in range(7)]
    sweeps = {sweep: {"x": [1, 10, 100], "records": {n: [record] * 3 for n in names},
                      "ratio_to_dpsharp_pld": {}} for sweep in ("T", "sigmas")}
    figure = speed.speed_figure({"q": 0.01, "delta": 1e-5, "repeats": 1, "sweeps": sweeps})
    renderer = figure.canvas.get_renderer()
    figure.draw(renderer)
    legend = figure.legends[0].get_window_extent(renderer)
    for axes in figure.axes:
        assert not legend.overlaps(axes.get_window_extent(renderer))
    assert [t.get_text() for t in figure.legends[0].get_texts()] == names


# ---------------------------------------------------------------------------- benches
def test_bench_precision_stdout_is_the_markdown_and_progress_goes_to_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps([{"q": 0.01, "sigma": 1.0, "steps": 100, "name": "tiny"}]))
    out_dir = tmp_path / "out"
    status, out, err = run_cli(capsys, "bench", "precision", "--no-peers", "--grid", str(grid),
                               "--output", str(out_dir))
    assert status == 0
    assert out == (out_dir / "results.md").read_text()
    assert all(line == "" or line.startswith(("#", "|", "gap =")) for line in out.splitlines())
    assert "tiny" in err and "written:" in err and "settings" in err


def test_bench_speed_stdout_is_the_markdown_and_quick_stops_slow_contenders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Progress on stderr only. --quick's budget: a contender over it at a point is timed once
    there, its larger points are skipped, and the distinct-sigma sweep (10^4 steps) is not
    started for a contender already over budget at T <= 10^4."""
    from dpsharp.bench import speed

    def slow(parts: list[tuple[float, int]]) -> float:
        import time

        time.sleep(speed.QUICK_BUDGET_SECONDS * 1.05)
        return 1.0

    contenders = {"fast": lambda parts: 0.5, "slow": slow}
    monkeypatch.setattr(speed, "_contenders", lambda use_peers: contenders)
    monkeypatch.setattr(speed, "_import_peers", lambda found: None)
    status, out, err = run_cli(capsys, "bench", "speed", "--quick", "--no-peers",
                               "--output", str(tmp_path))
    assert status == 0
    assert out == (tmp_path / "speed.md").read_text()
    assert "T=1000 fast" in err and "written:" in err and "T=1000" not in out
    results = json.loads((tmp_path / "speed.json").read_text())
    assert results["quick"] is True and results["budget_seconds"] == speed.QUICK_BUDGET_SECONDS
    t_sweep = results["sweeps"]["T"]["records"]
    assert [r["repeats"] for r in t_sweep["fast"]] == [3, 3, 3]
    assert t_sweep["slow"][0]["repeats"] == 1
    assert all("skipped" in r for r in t_sweep["slow"][1:])
    assert all("skipped" in r for r in results["sweeps"]["sigmas"]["records"]["slow"])


# ---------------------------------------------------------------------------- house
def test_cli_and_demo_do_not_import_each_other() -> None:
    """The statement and the trade-off figure live in dpsharp._report, which both use: demo
    imports nothing from the command, and the command reaches the demo only inside its own
    handler."""
    import ast

    def imported(path: Path) -> list[tuple[str, bool]]:
        tree = ast.parse(path.read_text())
        top = {id(node) for node in tree.body}
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                found.append((node.module, id(node) in top))
            elif isinstance(node, ast.Import):
                found += [(alias.name, id(node) in top) for alias in node.names]
        return found

    package = Path(dpsharp.__file__).parent
    assert not [m for m, _ in imported(package / "demo.py") if m.startswith("dpsharp.cli")]
    assert not [m for m, top in imported(package / "cli.py") if m.startswith("dpsharp") and top]


# ---------------------------------------------------------------------------- printed bounds
def _exact_directed(value: float, decimals: int, side: str) -> str:
    """The reference for directed rounding at ``decimals`` decimals, from the float's exact
    rational value (Fraction): ceil or floor of value * 10^d, written out digit by digit."""
    from fractions import Fraction

    scaled = Fraction(value) * 10**decimals
    integer = math.ceil(scaled) if side == "upper" else math.floor(scaled)
    sign = "-" if integer < 0 else ""
    digits = str(abs(integer)).rjust(decimals + 1, "0")
    return f"{sign}{digits[:-decimals]}.{digits[-decimals:]}" if decimals else f"{sign}{digits}"


def test_format_bound_rounds_towards_the_safe_side() -> None:
    """Each printed upper bound is the smallest decimal at the precision >= the float, each
    lower bound the largest <= it, against exact rational arithmetic; values exactly
    representable at the precision stay as they are."""
    import random

    from dpsharp._report import format_bound

    assert format_bound(1.82833043900206, ".4f", side="upper") == "1.8284"
    assert format_bound(1.82833043900206, ".4f", side="lower") == "1.8283"
    assert format_bound(1.29849044, ".4f", side="lower") == "1.2984"
    assert format_bound(2.5, ".4f", side="upper") == "2.5000"
    assert format_bound(2.5, ".4f", side="lower") == "2.5000"
    assert format_bound(None, ".4f", side="upper") == "inf"
    assert format_bound(math.inf, "6.3", side="upper") == "   inf"
    rng = random.Random(20261127)
    values = ([rng.uniform(0, 20) for _ in range(300)]
              + [10 ** rng.uniform(-6, 4) for _ in range(300)])
    for value in values:
        for decimals in (0, 1, 4, 6):
            for side in ("upper", "lower"):
                expected = _exact_directed(value, decimals, side)
                shown = format_bound(value, f".{decimals}f", side=side)
                assert shown == expected, (value, decimals, side)
    # significant digits (prv-accountant's {:6.3}, the statements' .4g): the printed number
    # brackets the float and differs from it by less than one unit in the last printed digit
    from fractions import Fraction

    for value in values:
        for spec, digits in (("6.3", 3), (".4g", 4)):
            up = Fraction(format_bound(value, spec, side="upper").strip())
            down = Fraction(format_bound(value, spec, side="lower").strip())
            unit = Fraction(10) ** (math.floor(math.log10(value)) - digits + 1)
            assert down <= Fraction(value) <= up, (value, spec)
            assert up - Fraction(value) < unit and Fraction(value) - down < unit, (value, spec)
    assert format_bound(2.0051, "6.3", side="upper") == "  2.01"
    assert format_bound(9.996, "6.3", side="upper") == "  10.0"
    assert format_bound(2.0, "6.3", side="upper") == format(2.0, "6.3")
    with pytest.raises(ValueError, match="side"):
        format_bound(1.0, ".4f", side="up")


_STATEMENT_LINE = r"^  (\w+)\s+epsilon =\s+(\S+)\s+\((certified upper bound|approximation)"


@pytest.mark.parametrize("sigma", ["1.0", "1.2", "0.9"])
def test_printed_bounds_are_bounds(sigma: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The statement's certified epsilon is >= the certified float of --json, its lower bound
    <= the JSON lower bound (both compared exactly, as rationals), and the "The run is
    (epsilon, delta)-DP" line states a certified epsilon. Rounding to nearest printed 1.8283
    for the certified 1.82833043900206 (sigma 1.0) and, at sigma 1.2, a lower bound 1.2985
    above the proven 1.29849044."""
    import re
    from fractions import Fraction

    argv = ["epsilon", "--sample-rate", "0.01", "--steps", "1000", "--noise-multiplier", sigma,
            "--delta", "1e-5", "--accountant", "pld", "rdp"]
    status, out, err = run_cli(capsys, *argv, "--json")
    assert status == 0, err
    fields = json.loads(out)["accountants"]
    status, text, err = run_cli(capsys, *argv)
    assert status == 0, err
    printed = {m[1]: m[2] for m in re.finditer(_STATEMENT_LINE, text, flags=re.MULTILINE)}
    assert set(printed) == {"pld", "rdp"}
    for name, shown in printed.items():
        assert fields[name]["certified"]
        assert Fraction(shown) >= Fraction(fields[name]["epsilon"]), (name, shown)
        assert Fraction(shown) - Fraction(fields[name]["epsilon"]) < Fraction(1, 10**4)
    lower = re.search(r"lower bound (\S+)\)", text)
    assert lower is not None and fields["pld"]["epsilon_lower"] is not None
    assert Fraction(lower[1]) <= Fraction(fields["pld"]["epsilon_lower"])
    run_is = re.search(r"The run is \((\S+), ", text)
    assert run_is is not None
    assert Fraction(run_is[1]) >= Fraction(min(fields[n]["epsilon"] for n in ("pld", "rdp")))


def test_calibrate_and_curve_print_bounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``dpsharp calibrate`` prints its achieved certified epsilon rounded up and its noise
    multiplier rounded up (more noise only lowers epsilon); ``dpsharp curve`` prints its
    certified epsilon rounded up: each printed number >= the float of --json."""
    import re
    from fractions import Fraction

    pytest.importorskip("matplotlib")
    calibrate = ["calibrate", "--dataset-size", "60000", "--batch-size", "600", "--steps", "1000",
                 "--target-epsilon", "1", "--delta", "1e-5", "--accountant", "pld"]
    status, out, err = run_cli(capsys, *calibrate, "--json")
    assert status == 0, err
    document = json.loads(out)
    status, text, err = run_cli(capsys, *calibrate)
    assert status == 0, err
    sigma = re.search(r"noise multiplier = (\S+)", text)
    achieved = re.search(r"achieved epsilon = (\S+) ", text)
    assert sigma is not None and achieved is not None
    assert Fraction(sigma[1]) >= Fraction(document["noise_multiplier"])
    assert Fraction(achieved[1]) >= Fraction(document["epsilon"])
    curve = ["curve", "--sample-rate", "0.01", "--steps", "1000", "--noise-multiplier", "1.0",
             "--delta", "1e-5", "--output", str(tmp_path / "curve.png")]
    status, out, err = run_cli(capsys, *curve, "--json")
    assert status == 0, err
    epsilon = json.loads(out)["epsilon_pld"]
    status, text, err = run_cli(capsys, *curve)
    assert status == 0, err
    shown = re.search(r"epsilon\(1e-05\) = (\S+) \(tight accountant, certified\)", text)
    assert shown is not None and Fraction(shown[1]) >= Fraction(epsilon)


@pytest.mark.peers
def test_calibrate_by_sample_rate_meets_the_target(capsys: pytest.CaptureFixture[str]) -> None:
    """``calibrate --sample-rate Q`` works (it used to be refused as "not allowed with
    --dataset-size" though no size was given: the first run built wrote the sizes into the
    arguments) and gives the same sigma as the equivalent --dataset-size/--batch-size form;
    dp-accounting's pessimistic PLD (an independent accountant, VDI 1e-4) puts the printed
    sigma's epsilon at or below the target."""
    import re

    dp_accounting = pytest.importorskip("dp_accounting")
    from dp_accounting.pld import pld_privacy_accountant

    common = ["--steps", "1000", "--target-epsilon", "1", "--delta", "1e-5", "--accountant", "pld"]
    status, out, err = run_cli(capsys, "calibrate", "--sample-rate", "0.01", *common, "--json")
    assert status == 0, err
    by_rate = json.loads(out)
    assert by_rate["inputs"]["sampling_probability"] == 0.01
    assert by_rate["inputs"]["dataset_size"] is None
    status, out, err = run_cli(capsys, "calibrate", "--dataset-size", "60000", "--batch-size",
                               "600", *common, "--json")
    assert status == 0, err
    assert json.loads(out)["noise_multiplier"] == by_rate["noise_multiplier"]
    status, text, err = run_cli(capsys, "calibrate", "--sample-rate", "0.01", *common)
    assert status == 0, err
    printed = re.search(r"noise multiplier = (\S+)", text)
    assert printed is not None
    for sigma in (by_rate["noise_multiplier"], float(printed[1])):
        peer = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
        peer.compose(dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(sigma)), 1000))
        assert peer.get_epsilon(1e-5) <= 1.0
    # the target is met tightly: 1% less noise exceeds it
    peer = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    peer.compose(dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        0.01, dp_accounting.GaussianDpEvent(0.99 * by_rate["noise_multiplier"])), 1000))
    assert peer.get_epsilon(1e-5) > 1.0


def test_calibrate_prints_a_tiny_achieved_epsilon_in_significant_digits(
        capsys: pytest.CaptureFixture[str]) -> None:
    """At six decimals a certified 9.99947e-10 printed as 0.000001, above its 1e-9 target; in
    significant digits, rounded up, it stays at or above the float and below the target. A
    target met at every noise multiplier names the run's own rate q = 0.01 (it said 1.0)."""
    import re
    from fractions import Fraction

    base = ["calibrate", "--sample-rate", "0.01", "--steps", "10", "--delta", "1e-5"]
    status, out, err = run_cli(capsys, *base, "--target-epsilon", "1e-9", "--json")
    assert status == 0, err
    certified = json.loads(out)["epsilon"]
    status, text, err = run_cli(capsys, *base, "--target-epsilon", "1e-9")
    assert status == 0, err
    printed = re.search(r"achieved epsilon = (\S+) ", text)
    assert printed is not None
    assert Fraction(certified) <= Fraction(printed[1]) <= Fraction("1e-9")
    status, out, err = run_cli(capsys, *base, "--target-epsilon", "1e9")
    assert status == 2 and "q=0.01" in err and "nothing to calibrate" in err


@pytest.mark.parametrize("argv", [
    ["epsilon", "--dataset-size", "60000", "--batch-size", "256", "--epochs", "1e308",
     "--noise-multiplier", "1.1", "--delta", "1e-5"],
    ["epsilon", "--sample-rate", "1e-300", "--epochs", "1e10", "--noise-multiplier", "1.1",
     "--delta", "1e-5"],
])
def test_huge_values_are_one_line_errors_not_tracebacks(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """Epoch counts whose step count overflows raised OverflowError with a traceback (exit 1);
    they are a one-line error naming epochs (exit 2)."""
    status, _, err = run_cli(capsys, *argv)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "epochs" in lines[0] and "2^53" in lines[0], err


def test_huge_noise_multiplier_is_answered(capsys: pytest.CaptureFixture[str]) -> None:
    """sigma = 1e200: epsilon 0 and the exact GDP bound 0 (the statement raised OverflowError
    in sigma**2)."""
    status, out, err = run_cli(capsys, "epsilon", "--dataset-size", "60000", "--batch-size",
                               "256", "--epochs", "1", "--noise-multiplier", "1e200",
                               "--delta", "1e-5", "--accountant", "pld", "--json")
    assert status == 0, err
    assert json.loads(out)["accountants"]["pld"]["epsilon"] == 0.0


def test_epochs_never_drop_a_fractional_last_step() -> None:
    """T = ceil(E n / B): 1.0000000005 epochs of a full batch are 2 steps (an absolute 1e-9
    taken off before the ceiling made them 1); a decimal the double cannot hold (0.1 epochs of
    n = 1000, B = 100: 1.0000000000000000555 in binary) is the whole number it spells."""
    from dpsharp._dpsgd import steps_for_epochs

    assert steps_for_epochs(1.0000000005, 1000, 1000) == 2
    assert steps_for_epochs(1.0000000000000002, 5, 5) == 2  # the double just above 1
    assert steps_for_epochs(0.1, 1000, 100) == 1
    assert steps_for_epochs(3.0, 60000, 256) == math.ceil(3 * 60000 / 256)
    assert steps_for_epochs(60, 60000, 256) == MNIST_STEPS


def test_the_statement_prints_delta_exactly(capsys: pytest.CaptureFixture[str]) -> None:
    """delta = 1.0000004e-5 was printed as 1e-05 (six digits to nearest): a smaller delta than
    the epsilon was computed at."""
    status, out, _ = run_cli(capsys, "epsilon", *MNIST[:-2], "--delta", "1.0000004e-5",
                             "--accountant", "pld")
    assert status == 0 and "1.0000004e-05" in out and "1e-05)" not in out

"""The ``dpsharp`` command (also ``python -m dpsharp``).

Sub-commands:

``dpsharp demo``
    The main job: trains a small CNN on scikit-learn's bundled digits with NoisyAdam under a
    privacy budget (progress bar), prints the accuracy and every accountant's statement of the
    run, and writes epsilon-vs-epoch and trade-off plots to ``--output DIR`` (see
    :mod:`dpsharp.demo`).
``dpsharp epsilon``
    The privacy statement of a DP-SGD run, in the vocabulary of TF Privacy's
    ``compute_dp_sgd_privacy`` and Opacus: ``--dataset-size N --batch-size B (--epochs E |
    --steps T) --noise-multiplier S --delta D [--sampling poisson|shuffle|fixed]
    [--accountant NAME ... | all] [--json] [--plot FILE.png]``.
``dpsharp calibrate``
    The noise multiplier that reaches ``--target-epsilon`` at ``--delta`` under an accountant.
``dpsharp curve``
    The trade-off curve of the composition (tight accountant) next to G_mu and the
    (epsilon, delta) curves, written to ``--output FILE.png``.
``dpsharp bench precision [--output DIR] [--grid FILE.json] [--no-peers]``
    Epsilon, certified bounds, time and gap to the tightest certified bound of every accountant
    and the installed peers (:mod:`dpsharp.bench.precision`).
``dpsharp bench speed [--quick] [--output DIR]``
    Query time against the peers, scaling in T and in distinct sigmas (:mod:`dpsharp.bench.speed`).
``dpsharp accountants``
    The registered accountant names.
``dpsharp audit``
    One-run privacy audit (Steinke, Nasr, Jagielski 2023) of a DP-SGD run of a small built-in
    model on the digits with gradient canaries: eps_lower next to the accountant's eps_upper
    (:mod:`dpsharp.torch.audit`); exit status 0 if eps_lower <= eps_upper, 1 if not.

``dpsharp epsilon --json`` prints one object::

    {"inputs": {"dataset_size", "batch_size", "epochs", "steps", "noise_multiplier", "delta",
                "sampling", "sampling_probability", "neighbouring", "event" (the unit event as
                dpsharp.events.event_to_dict gives it), "count", "assumption"},
     "accountants": {NAME: {"applicable": true, "epsilon" (the reported number: a certified
                            upper bound when "certified"), "epsilon_lower" (proven lower bound
                            or null), "certified", "neighbouring", "warning", "options" (the
                            constructor options: dpsharp.accountant(NAME, **options)
                            reproduces it), the accountant's scalar details, and "order" (RDP,
                            moments), "mu" (gdp), "rho" (zcdp), "gdp_mu" (pld, certified)
                            and "gdp_mu_informative" (pld: whether the statement shows it)}
                     | {"applicable": false, "reason": "..."}},
     "plot": {"file", "epochs": {NAME: [...]}, "epsilon": {NAME: [...]}}   (with --plot)}

Non-finite numbers are written as null.

The noise multiplier is noise standard deviation / clipping norm, as in TF Privacy and Opacus;
how each sampling scheme turns it into events is documented in :mod:`dpsharp._dpsgd`.
Usage errors print one line naming the flag and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

__all__ = ["main"]

_DEFAULT_CALIBRATION_ACCOUNTANT = "pld"
#: Why a statement shows no certified GDP mu (dpsharp._report.gdp_mu_is_informative).
_HIDDEN_GDP_MU = (
    "No certified GDP mu is shown: a subsampled run of finitely many steps is mu-GDP only for "
    "mu >= sqrt(sum of 1/sigma^2 over its steps) (the event that every step samples the "
    "record), far above the central-limit mu; the certified statements are the epsilon above "
    "and the trade-off curve."
)
_HIDDEN_GDP_MU_NOTE = (
    "No certified G_mu drawn: a subsampled run is mu-GDP only for mu >= sqrt(T)/sigma,\n"
    "far above the central-limit mu (an approximation); the thick curve is certified."
)
#: Short names of the neighbouring relations for statements (the Assumption line says them in
#: full, from dpsharp.events.RELATION_WORDS).
_RELATION_NAMES = {
    "add_remove": "add/remove-one",
    "zero_out": "zero-out",
    "replace_one": "replace-one",
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


# ---------------------------------------------------------------------------- flag types
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    value = _finite_float(text)
    if value <= 0.0:
        raise argparse.ArgumentTypeError(f"must be in (0, inf), got {text!r}")
    return value


def _delta(text: str) -> float:
    value = _finite_float(text)
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1), got {text!r}")
    return value


def _add_run_flags(parser: argparse.ArgumentParser, *, noise: bool = True) -> None:
    parser.add_argument("--dataset-size", type=_positive_int, required=True, metavar="N",
                        help="number of training examples n")
    parser.add_argument("--batch-size", type=_positive_int, required=True, metavar="B",
                        help="(expected) batch size; sampling rate q = B/N")
    length = parser.add_mutually_exclusive_group(required=True)
    length.add_argument("--epochs", type=_positive_float, metavar="E",
                        help="passes over the data; steps = ceil(E*N/B) as in TF Privacy")
    length.add_argument("--steps", type=_positive_int, metavar="T", help="number of noisy steps")
    if noise:
        parser.add_argument("--noise-multiplier", type=_positive_float, required=True,
                            metavar="S", help="noise standard deviation / clipping norm")
    parser.add_argument("--delta", type=_delta, required=True, metavar="D",
                        help="target delta in (0, 1)")
    parser.add_argument("--sampling", choices=("poisson", "shuffle", "fixed"), default="poisson",
                        help="how batches are drawn (default poisson; see the statement)")


def _run_from_args(args: argparse.Namespace, noise_multiplier: float | None = None) -> Any:
    from dpsharp._dpsgd import DPSGDRun, steps_for_epochs

    if args.batch_size > args.dataset_size:
        args._parser.error(
            f"argument --batch-size: must be at most --dataset-size={args.dataset_size}, "
            f"got {args.batch_size}"
        )
    if args.steps is not None:
        steps = args.steps
    else:
        steps = steps_for_epochs(args.epochs, args.dataset_size, args.batch_size)
    sigma = args.noise_multiplier if noise_multiplier is None else noise_multiplier
    return DPSGDRun(args.dataset_size, args.batch_size, steps, sigma, args.sampling)


def _accountant_names(args: argparse.Namespace, requested: Sequence[str] | None) -> list[str]:
    import dpsharp

    available = dpsharp.available()
    if not requested or list(requested) == ["all"]:
        return available
    names: list[str] = []
    for name in requested:
        if name == "all":
            args._parser.error("argument --accountant: 'all' cannot be combined with names")
        if name not in available:
            args._parser.error(
                f"argument --accountant: must be 'all' or one of {', '.join(available)}; "
                f"got {name!r}"
            )
        if name not in names:
            names.append(name)
    return names


def _check_plot_flag(args: argparse.Namespace, flag: str) -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        args._parser.error(
            f"argument {flag}: plotting needs matplotlib, which is not installed "
            "(pip install \"dpsharp[plot]\")"
        )


def _fmt(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "inf"
    return f"{value:.{digits}f}"


# ---------------------------------------------------------------------------- demo
def _run_demo(args: argparse.Namespace) -> int:
    if args.epochs < 1:
        raise ValueError(f"--epochs must be a positive integer, got {args.epochs}")
    _check_plot_flag(args, "--output")
    from dpsharp.demo import run_demo

    return run_demo(args)


# ---------------------------------------------------------------------------- epsilon
def _inputs(run: Any, args: argparse.Namespace) -> dict[str, Any]:
    from dpsharp.events import event_to_dict

    return {
        "dataset_size": run.dataset_size,
        "batch_size": run.batch_size,
        "epochs": args.epochs if args.epochs is not None else run.epochs,
        "steps": run.steps,
        "noise_multiplier": run.noise_multiplier,
        "delta": args.delta,
        "sampling": run.sampling,
        "sampling_probability": run.sampling_probability,
        "neighbouring": run.neighbouring.value,
        "event": event_to_dict(run.event),
        "count": run.count,
        "assumption": run.assumption(),
    }


def _describe(fields: dict[str, Any], *, with_warning: bool = True) -> str:
    if not fields["applicable"]:
        return f"not applicable: {fields['reason']}"
    parts = ["certified upper bound" if fields["certified"] else "approximation"]
    if fields.get("epsilon_lower") is not None:
        parts.append(f"lower bound {_fmt(fields['epsilon_lower'])}")
    if fields.get("order") is not None:
        parts.append(f"order {fields['order']:g}")
    if fields.get("mu") is not None:
        parts.append(f"mu = {fields['mu']:.4g}")
    if fields.get("gdp_mu") is not None and fields.get("gdp_mu_informative", True):
        parts.append(f"certified GDP mu = {fields['gdp_mu']:.4g}")
    if fields.get("rho") is not None:
        parts.append(f"rho = {fields['rho']:.4g}")
    text = "; ".join(parts)
    if fields.get("warning") and with_warning:
        text += f". Warning: {fields['warning']}"
    return text


def _print_statement(run: Any, args: argparse.Namespace, results: list[Any]) -> None:
    import dpsharp

    print(f"dpsharp {dpsharp.__version__} privacy statement")
    length = (f"{args.epochs:g} epochs = {run.steps} steps" if args.epochs is not None
              else f"{run.steps} steps = {run.epochs:.4g} epochs")
    print(
        f"DP-SGD with {run.dataset_size} examples, batch size {run.batch_size}, {length}, "
        f"noise multiplier {run.noise_multiplier:g} (noise std / clipping norm), delta = {args.delta:g}."
    )
    print(f"Assumption: {run.assumption()}")
    print()
    width = max(len(result.name) for result in results)
    for result in results:
        fields = result.fields
        value = _fmt(fields.get("epsilon")) if fields["applicable"] else "-"
        print(f"  {result.name:<{width}}  epsilon = {value:>9}  ({_describe(fields)})")
    certified = [r for r in results if r.applicable and r.fields["certified"]]
    print()
    if certified:
        best = min(certified, key=lambda r: math.inf if r.fields["epsilon"] is None else r.fields["epsilon"])
        print(
            f"The run is ({_fmt(best.fields['epsilon'])}, {args.delta:g})-DP under "
            f"{_RELATION_NAMES[run.neighbouring.value]} neighbouring (certified, {best.name} "
            "accountant). Approximations are labelled and are not bounds."
        )
    tight = next((r for r in results if r.applicable and "gdp_mu" in r.fields), None)
    gdp = tight if tight is not None and tight.fields.get("gdp_mu_informative") else None
    clt = next((r for r in results if r.applicable and r.name == "gdp" and r.fields.get("mu") is not None), None)
    if gdp is not None or clt is not None:
        pieces = []
        if gdp is not None:
            pieces.append(f"certified mu = {gdp.fields['gdp_mu']:.4g} ({gdp.name}: proven, every "
                          "test of the run is at least as hard as telling N(0,1) from N(mu,1))")
        if clt is not None:
            pieces.append(f"central-limit mu = {clt.fields['mu']:.4g} (approximation)")
        print("Gaussian DP: " + "; ".join(pieces) + ".")
        if tight is not None and gdp is None:
            print(_HIDDEN_GDP_MU)


def _run_epsilon(args: argparse.Namespace) -> int:
    from dpsharp._report import epsilon_series, evaluate

    run = _run_from_args(args)
    names = _accountant_names(args, args.accountant)
    if args.plot is not None:
        _check_plot_flag(args, "--plot")
    results = [evaluate(run, name, args.delta) for name in names]
    document: dict[str, Any] = {
        "inputs": _inputs(run, args),
        "accountants": {result.name: result.fields for result in results},
    }
    if args.plot is not None:
        from dpsharp import plots

        series = {}
        for result in results:
            if not result.applicable:
                continue
            data = epsilon_series(run, result.name, args.delta)
            if data is not None:
                series[result.name] = data
        plots.epsilon_vs_epochs(
            series,
            delta=args.delta,
            certified={r.name: bool(r.fields.get("certified")) for r in results if r.applicable},
            title=f"n={run.dataset_size}, B={run.batch_size}, sigma={run.noise_multiplier:g}, {run.sampling}",
            path=args.plot,
        )
        document["plot"] = {
            "file": str(args.plot),
            "epochs": {name: xs.tolist() for name, (xs, _) in series.items()},
            "epsilon": {name: ys.tolist() for name, (_, ys) in series.items()},
        }
    if args.json:
        print(json.dumps(document, indent=2, allow_nan=False))
    else:
        _print_statement(run, args, results)
        if args.plot is not None:
            print(f"Plot of epsilon against epochs written to {args.plot}.")
    return 0


# ---------------------------------------------------------------------------- calibrate
def _run_calibrate(args: argparse.Namespace) -> int:
    import dpsharp
    from dpsharp._report import evaluate

    names = _accountant_names(args, [args.accountant])
    name = names[0]
    template = _run_from_args(args, noise_multiplier=1.0)
    sigma = _calibrate_noise(args, template, name)
    run = _run_from_args(args, noise_multiplier=sigma)
    result = evaluate(run, name, args.delta)
    document = {
        "inputs": {**_inputs(run, args), "target_epsilon": args.target_epsilon, "accountant": name},
        "noise_multiplier": sigma,
        "epsilon": result.fields.get("epsilon"),
        "certified": result.fields.get("certified"),
        "accountant": result.fields,
    }
    if args.json:
        print(json.dumps(document, indent=2, allow_nan=False))
    else:
        kind = "certified upper bound" if result.fields.get("certified") else "approximation"
        print(f"dpsharp {dpsharp.__version__} calibration ({name} accountant, {run.sampling} sampling)")
        print(f"noise multiplier = {sigma:.6g}")
        print(
            f"achieved epsilon = {_fmt(result.fields.get('epsilon'), 6)} at delta = {args.delta:g} "
            f"({kind}; target {args.target_epsilon:g}) after {run.steps} steps"
        )
    return 0


def _calibrate_noise(args: argparse.Namespace, template: Any, name: str) -> float:
    """The noise multiplier that meets the target, from dpsharp.calibrate (conservative)."""
    from dpsharp._report import calibrate_noise

    try:
        return calibrate_noise(
            template.event_for,
            template.count,
            name,
            target_epsilon=args.target_epsilon,
            delta=args.delta,
            options=template.accountant_options(name),
            require_certified=not args.allow_approximation,
        )
    except ValueError as exc:
        message = str(exc).replace("pass allow_approximation=True", "pass --allow-approximation")
        raise ValueError(message) from exc


# ---------------------------------------------------------------------------- curve
def write_tradeoff_figure(run: Any, delta: float, path: Any) -> dict[str, Any]:
    """Draw the composition's certified trade-off curve next to G_mu (certified and CLT mu) and
    the (epsilon, delta) curves to ``path``; returns the data (arrays as lists)."""
    import numpy as np

    from dpsharp import plots
    from dpsharp._report import tradeoff_data

    alphas = np.concatenate([np.geomspace(1e-6, 1e-2, 40, endpoint=False), np.linspace(1e-2, 1.0, 161)])
    alphas = np.concatenate([[0.0], alphas])
    data = tradeoff_data(run, delta, alphas)
    curves: dict[str, Any] = {"tight accountant (certified)": data["pld"]}
    if "gdp_certified" in data:
        curves[f"G_mu, certified mu = {data['gdp_mu_certified']:.3g} (proven lower bound)"] = (
            data["gdp_certified"])
    if "gdp_clt" in data:
        curves[f"G_mu, CLT mu = {data['gdp_mu_clt']:.3g} (approx.)"] = data["gdp_clt"]
    curves[f"({data['epsilon_pld']:.3g}, {delta:g})-DP, tight"] = data["eps_delta"]
    if "eps_delta_rdp" in data:
        curves[f"({data['epsilon_rdp']:.3g}, {delta:g})-DP, RDP"] = data["eps_delta_rdp"]
    plots.tradeoff_curves(
        curves,
        alphas=alphas,
        title=f"n={run.dataset_size}, B={run.batch_size}, sigma={run.noise_multiplier:.3g}, T={run.steps}",
        note=None if "gdp_certified" in data else _HIDDEN_GDP_MU_NOTE,
        path=path,
    )
    return {key: (value.tolist() if isinstance(value, np.ndarray) else value) for key, value in data.items()}


def _run_curve(args: argparse.Namespace) -> int:
    _check_plot_flag(args, "--output")
    run = _run_from_args(args)
    data = write_tradeoff_figure(run, args.delta, args.output)
    summary = {key: value for key, value in data.items() if not isinstance(value, list)}
    if args.json:
        document = {"inputs": _inputs(run, args), "output": str(args.output), **summary,
                    "curves": {key: value for key, value in data.items() if isinstance(value, list)}}
        print(json.dumps(document, indent=2, allow_nan=False))
    else:
        print(f"Trade-off curve written to {args.output}.")
        print(f"epsilon({args.delta:g}) = {data['epsilon_pld']:.4f} (tight accountant, certified)")
        if data["gdp_mu_informative"]:
            print(f"certified GDP mu = {data['gdp_mu_certified']:.4g} (proven: the curve lies "
                  "above G_mu)")
        if "gdp_mu_clt" in data:
            print(f"central-limit GDP mu = {data['gdp_mu_clt']:.4g} (approximation)")
        if not data["gdp_mu_informative"]:
            print(_HIDDEN_GDP_MU)
    return 0


# ---------------------------------------------------------------------------- accountants
def _run_accountants(args: argparse.Namespace) -> int:
    import dpsharp

    for name in dpsharp.available():
        instance = dpsharp.accountant(name)  # certification belongs to the configured instance
        cls = type(instance)
        doc = (cls.__doc__ or "").strip().splitlines()
        kind = "certified" if instance.certified else "approximation"
        print(f"{name:<10} {cls.__name__} ({kind}): {doc[0] if doc else ''}")
    return 0


# ---------------------------------------------------------------------------- bench
def _run_bench_precision(args: argparse.Namespace) -> int:
    import warnings

    from dpsharp.bench import precision

    grid = precision.load_grid(args.grid) if args.grid else list(precision.DEFAULT_GRID)
    print(f"dpsharp bench precision: {len(grid)} settings")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peers warn (opacus GDP is experimental, ...)
        results = precision.run_precision(grid, use_peers=not args.no_peers, progress=True)
    skipped = results["skipped_peers"]
    if args.no_peers:
        print("peers skipped: --no-peers (dpsharp's accountants only)")
    else:
        print(f"peers skipped (not installed): {', '.join(skipped)}" if skipped else "peers: all installed")
    print(precision.markdown_table(results))
    if args.output:
        files = precision.write_outputs(results, args.output)
        print("written: " + ", ".join(str(f) for f in files))
    return 0


def _run_bench_speed(args: argparse.Namespace) -> int:
    import warnings

    from dpsharp.bench import speed

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = speed.run_speed(quick=args.quick, use_peers=not args.no_peers, progress=True)
    print(speed.markdown(results))
    if args.output:
        files = speed.write_outputs(results, args.output)
        print("written: " + ", ".join(str(f) for f in files))
    return 0


# ---------------------------------------------------------------------------- parser
def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dpsharp", description="Privacy accounting for DP-SGD: "
                     "statements, calibration and plots from every dpsharp accountant.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="the main job: DP training on digits, every accountant's "
                               "statement, plots")
    demo.add_argument("--output", default="dpsharp-demo", metavar="DIR",
                      help="folder for the plots and demo.json (default ./dpsharp-demo)")
    demo.add_argument("--epochs", type=_positive_int, default=20, help="epochs (default 20)")
    demo.add_argument("--target-epsilon", type=_positive_float, default=3.0, metavar="EPS",
                      help="privacy budget epsilon (default 3)")
    demo.add_argument("--delta", type=_delta, default=1e-5, help="target delta (default 1e-5)")
    demo.add_argument("--batch-size", type=_positive_int, default=256, help="expected batch size (default 256)")
    demo.add_argument("--lr", type=_positive_float, default=2e-2, help="Adam learning rate (default 0.02)")
    demo.add_argument("--max-grad-norm", type=_positive_float, default=1.0, help="clipping norm (default 1)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(handler=_run_demo, _parser=demo)

    epsilon = commands.add_parser("epsilon", help="privacy statement of a DP-SGD run")
    _add_run_flags(epsilon)
    epsilon.add_argument("--accountant", nargs="+", metavar="NAME", default=["all"],
                         help="accountants to ask (names, or 'all', the default)")
    epsilon.add_argument("--json", action="store_true", help="print one JSON object")
    epsilon.add_argument("--plot", metavar="FILE.png", help="also draw epsilon against epochs")
    epsilon.set_defaults(handler=_run_epsilon, _parser=epsilon)

    calibrate = commands.add_parser("calibrate", help="noise multiplier for a target epsilon")
    calibrate.add_argument("--target-epsilon", type=_positive_float, required=True, metavar="EPS")
    _add_run_flags(calibrate, noise=False)
    calibrate.add_argument("--accountant", default=_DEFAULT_CALIBRATION_ACCOUNTANT, metavar="NAME",
                           help=f"accountant to calibrate against (default {_DEFAULT_CALIBRATION_ACCOUNTANT})")
    calibrate.add_argument("--allow-approximation", action="store_true",
                           help="allow calibrating on an approximate accountant (gdp, zcdp with "
                           "Poisson sampling); not conservative")
    calibrate.add_argument("--json", action="store_true", help="print one JSON object")
    calibrate.set_defaults(handler=_run_calibrate, _parser=calibrate)

    curve = commands.add_parser("curve", help="trade-off curve of the composition (PNG)")
    _add_run_flags(curve)
    curve.add_argument("--output", required=True, metavar="FILE.png", help="where to write the figure")
    curve.add_argument("--json", action="store_true", help="also print the curves as JSON")
    curve.set_defaults(handler=_run_curve, _parser=curve)

    bench = commands.add_parser("bench", help="benchmarks against the peer libraries")
    benches = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    precision = benches.add_parser("precision", help="epsilon, bounds, time and gap of every accountant")
    precision.add_argument("--output", metavar="DIR", help="write results.json/.csv/.md and plots here")
    precision.add_argument("--grid", metavar="FILE.json",
                           help="settings: a JSON list of {q, sigma, steps, delta?, name?}")
    precision.add_argument("--no-peers", action="store_true", help="dpsharp's accountants only")
    precision.set_defaults(handler=_run_bench_precision, _parser=precision)
    speed = benches.add_parser("speed", help="query time against the peers, scaling in T and sigmas")
    speed.add_argument("--output", metavar="DIR", help="write speed.json/.md/.png here")
    speed.add_argument("--quick", action="store_true", help="T up to 10^5, 3 repeats")
    speed.add_argument("--no-peers", action="store_true", help="dpsharp's accountants only")
    speed.set_defaults(handler=_run_bench_speed, _parser=speed)

    listing = commands.add_parser("accountants", help="list the registered accountants")
    listing.set_defaults(handler=_run_accountants, _parser=listing)
    _add_audit_command(commands)
    return parser


# ---------------------------------------------------------------------------- audit
def _add_audit_command(commands: Any) -> None:
    audit = commands.add_parser("audit", help="one-run privacy audit of DP-SGD with canaries")
    audit.add_argument("--noise-multiplier", type=_finite_float, default=2.0, metavar="S",
                       help="noise std / clipping bound (default 2)")
    audit.add_argument("--max-grad-norm", type=_positive_float, default=1.0, metavar="C",
                       help="clipping bound (default 1)")
    audit.add_argument("--steps", type=_positive_int, default=100, help="noisy steps (default 100)")
    audit.add_argument("--sample-rate", type=_finite_float, default=0.05, metavar="Q",
                       help="Poisson sampling rate (default 0.05)")
    audit.add_argument("--canaries", type=_positive_int, default=1000, metavar="M",
                       help="gradient canaries, each included with probability 1/2 (default 1000)")
    audit.add_argument("--confidence", type=_finite_float, default=0.95,
                       help="confidence of the lower bound, in (0, 1) (default 0.95)")
    audit.add_argument("--delta", type=_delta, default=1e-5, help="delta (default 1e-5)")
    audit.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    audit.add_argument("--json", action="store_true", help="print one JSON object")
    audit.add_argument("--plot", metavar="FILE.png", help="also draw the canaries' scores")
    audit.add_argument("--no-progress", action="store_true", help="no progress bar")
    audit.set_defaults(handler=_run_audit, _parser=audit)


def _run_audit(args: argparse.Namespace) -> int:
    from dpsharp.torch.audit import audit_digits

    result = audit_digits(
        noise_multiplier=args.noise_multiplier, max_grad_norm=args.max_grad_norm,
        steps=args.steps, sample_rate=args.sample_rate, delta=args.delta,
        canaries=args.canaries, confidence=args.confidence, seed=args.seed,
        progress=not args.no_progress,
    )
    if args.json:
        score, k, correct, _ = result.best
        print(json.dumps({
            "epsilon_lower": result.epsilon_lower, "epsilon_upper": result.epsilon_upper,
            "passed": result.passed, "certified": result.certified,
            "confidence": result.confidence, "delta": result.delta,
            "canaries": result.canaries, "included": result.included, "steps": result.steps,
            "best": {"score": score, "k": k, "correct": correct, "guesses": 2 * k},
        }))
    else:
        print(result.summary())
    if args.plot:
        result.plot(args.plot)
    return 0 if result.passed else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 2 usage error)."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except (ValueError, TypeError, ImportError) as exc:
        message = " ".join(str(exc).split())
        print(f"dpsharp {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

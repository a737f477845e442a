"""The ``dpsharp`` command (also ``python -m dpsharp``).

Sub-commands:

``dpsharp demo``
    The main job: trains a small CNN on scikit-learn's bundled digits with NoisyAdam under a
    privacy budget (progress bar), prints the accuracy and every accountant's statement of the
    run, and writes epsilon-vs-epoch and trade-off plots to ``--output DIR`` (see
    :mod:`dpsharp.demo`).
``dpsharp epsilon``
    The privacy statement of a DP-SGD run, in the vocabulary of TF Privacy's
    ``compute_dp_sgd_privacy`` and Opacus: ``(--dataset-size N --batch-size B | --sample-rate Q)
    (--epochs E | --steps T) --noise-multiplier S --delta D [--sampling poisson|shuffle|fixed]
    [--accountant NAME ... | all] [--json] [--plot FILE.png [--plot-classic]]``.
    ``--sample-rate Q`` (Poisson sampling only) replaces the two sizes; the plot leaves the
    classic composition bound out unless ``--plot-classic`` asks for it.
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
    The registered accountants, each with its description and whether its answer for a DP-SGD
    run is certified or an approximation under each sampling scheme.
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
Usage errors, bad input and files that cannot be read or written print one line naming the
flag (no traceback) and exit with status 2. ``dpsharp --version`` prints the version. Start-up
imports nothing heavy (numpy, scipy and the accountants load inside the commands), so
``--help`` and usage errors answer at once.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, NoReturn

__all__ = ["main"]

_DEFAULT_CALIBRATION_ACCOUNTANT = "pld"
#: Accountants whose curves ``epsilon --plot`` and ``demo`` draw only when asked
#: (--plot-classic): the classic composition theorems' bound is orders of magnitude above the
#: others (1303 against 2.4 for 60 epochs of MNIST) and would only stretch the axis.
_PLOT_ONLY_WHEN_ASKED = ("classic",)
class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


# ---------------------------------------------------------------------------- flag types
def _int_in(interval: str, low: int, high: int | None) -> Callable[[str], int]:
    """An argument type: an integer in [low, high] (no upper end for None), refused naming
    ``interval`` otherwise."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be an integer in {interval}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be an integer in {interval}, got {text!r}")
        return value

    return parse


# Counts up to 2^53: the integers a double holds exactly (counts beyond are not meaningful
# here and overflow the computations that take them).
_positive_int = _int_in("[1, 2^53]", 1, 2**53)
_at_least_two = _int_in("[2, 2^53]", 2, 2**53)
_non_negative_int = _int_in("[0, inf)", 0, None)


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _float_in(interval: str, low: float, high: float, *, include_low: bool,
              include_high: bool) -> Callable[[str], float]:
    """An argument type: a finite number in ``interval`` (``"(0, 1]"`` for low = 0 excluded,
    high = 1 included), refused naming the interval otherwise."""

    def parse(text: str) -> float:
        value = _finite_float(text)
        above = value >= low if include_low else value > low
        below = value <= high if include_high else value < high
        if not (above and below):
            raise argparse.ArgumentTypeError(f"must be in {interval}, got {text!r}")
        return value

    return parse


_positive_float = _float_in("(0, inf)", 0.0, math.inf, include_low=False, include_high=False)
_non_negative_float = _float_in("[0, inf)", 0.0, math.inf, include_low=True, include_high=False)
_probability = _float_in("(0, 1]", 0.0, 1.0, include_low=False, include_high=True)
_open_unit = _float_in("(0, 1)", 0.0, 1.0, include_low=False, include_high=False)
_delta = _open_unit


def _sample_rate(text: str) -> Fraction:
    """q in (0, 1] as an exact fraction of the text ("0.004266", "1e-3" or "256/60000")."""
    try:
        value = Fraction(text.strip())
    except (ValueError, ZeroDivisionError):
        raise argparse.ArgumentTypeError(
            f"must be a number in (0, 1] (e.g. 0.01 or 256/60000), got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    if float(value) < sys.float_info.min:
        raise argparse.ArgumentTypeError(
            f"must be in (0, 1] and at least {sys.float_info.min:.6g} (the smallest normal "
            f"double), got {text!r}")
    return value


def _output_file(text: str) -> Path:
    """A file to write: its folder must exist (checked before any work is done)."""
    path = Path(text)
    if not text or path.is_dir():
        raise argparse.ArgumentTypeError(f"must name a file, got the folder {text!r}")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"the folder {str(path.parent)!r} of {text!r} does not exist")
    return path


def _output_folder(text: str) -> Path:
    """A folder to write into (created if missing): it must not be a file, and the nearest
    existing folder above it must be writable."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a file, not a folder")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot create or write to the folder {text!r}")
    return path


def _input_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        why = "is a folder" if path.is_dir() else "does not exist"
        raise argparse.ArgumentTypeError(f"the file {text!r} {why}")
    return path


def _add_run_flags(parser: argparse.ArgumentParser, *, noise: bool = True) -> None:
    parser.add_argument("--dataset-size", type=_positive_int, metavar="N",
                        help="number of training examples n (with --batch-size)")
    parser.add_argument("--batch-size", type=_positive_int, metavar="B",
                        help="(expected) batch size; sampling rate q = B/N")
    parser.add_argument("--sample-rate", type=_sample_rate, metavar="Q",
                        help="Poisson sampling rate q in (0, 1], e.g. 0.01 or 256/60000, "
                        "instead of --dataset-size and --batch-size (Poisson sampling only)")
    length = parser.add_mutually_exclusive_group(required=True)
    length.add_argument("--epochs", type=_positive_float, metavar="E",
                        help="passes over the data; steps = ceil(E/q), q = B/N, as in TF Privacy")
    length.add_argument("--steps", type=_positive_int, metavar="T", help="number of noisy steps")
    if noise:
        parser.add_argument("--noise-multiplier", type=_positive_float, required=True,
                            metavar="S", help="noise standard deviation / clipping norm")
    parser.add_argument("--delta", type=_delta, required=True, metavar="D",
                        help="target delta in (0, 1)")
    parser.add_argument("--sampling", choices=("poisson", "shuffle", "fixed"), default="poisson",
                        help="how batches are drawn: poisson (each example joins each batch "
                        "with probability q), shuffle (reshuffled epochs of fixed-size "
                        "batches) or fixed (fixed-size batches drawn without replacement); the "
                        "statement says what each assumes (default poisson)")


def _check_run_flags(args: argparse.Namespace) -> None:
    """--sample-rate Q, or --dataset-size N and --batch-size B: one of the two, not both."""
    sizes = [flag for flag, value in (("--dataset-size", args.dataset_size),
                                      ("--batch-size", args.batch_size)) if value is not None]
    if args.sample_rate is not None:
        if sizes:
            args._parser.error(f"argument --sample-rate: not allowed with {sizes[0]} (give "
                               "--sample-rate Q, or --dataset-size N and --batch-size B)")
        if args.sampling != "poisson":
            args._parser.error(f"argument --sample-rate: describes Poisson sampling; --sampling "
                               f"{args.sampling} needs --dataset-size and --batch-size")
        return
    if len(sizes) < 2:
        missing = " and ".join(flag for flag in ("--dataset-size", "--batch-size")
                               if flag not in sizes)
        args._parser.error(f"the following arguments are required: {missing} (or "
                           "--sample-rate Q)")


def _sample_rate_run(*fields: Any) -> Any:
    """A Poisson run given by its sampling rate alone: the :class:`dpsharp._dpsgd.DPSGDRun` of
    q = B / n with (n, B) the fraction the flag spells, whose assumption speaks of q alone (that
    fraction's numerator is no batch size of the user's)."""
    from dpsharp._dpsgd import DPSGDRun

    class SampleRateRun(DPSGDRun):
        def assumption(self) -> str:
            _, rest = super().assumption().split(". ", 1)  # past the sentence naming B and n
            return ("Poisson sampling: every example joins each batch independently with "
                    f"probability q = {self.sampling_probability:.6g}, so batch sizes vary "
                    f"around q times the number of examples. {rest}")

    return SampleRateRun(*fields)


def _run_from_args(args: argparse.Namespace, noise_multiplier: float | None = None) -> Any:
    from dpsharp._dpsgd import DPSGDRun, steps_for_epochs

    _check_run_flags(args)
    if args.sample_rate is not None:
        # q = B / n exactly, from the fraction the flag spells (0.004266 = 2133/500000): the
        # Poisson event's q is then the float of the text, and statements print q alone. Kept
        # local: args stays as parsed, so the run can be built again (calibrate builds two)
        dataset_size, batch_size = args.sample_rate.denominator, args.sample_rate.numerator
    else:
        dataset_size, batch_size = args.dataset_size, args.batch_size
    if batch_size > dataset_size:
        args._parser.error(
            f"argument --batch-size: must be at most --dataset-size={dataset_size}, "
            f"got {batch_size}"
        )
    if args.steps is not None:
        steps = args.steps
    else:
        steps = steps_for_epochs(args.epochs, dataset_size, batch_size)
    sigma = args.noise_multiplier if noise_multiplier is None else noise_multiplier
    make = DPSGDRun if args.sample_rate is None else _sample_rate_run
    return make(dataset_size, batch_size, steps, sigma, args.sampling)


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


def _check_plot_flag(args: argparse.Namespace, flag: str, *, image: Path | None = None) -> None:
    """Plotting needs matplotlib; an ``image`` file's suffix must be a format it writes
    (checked before any work is done)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        args._parser.error(
            f"argument {flag}: plotting needs matplotlib, which is not installed "
            "(pip install \"dpsharp[plot]\")"
        )
    if image is not None and image.suffix:
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        if image.suffix[1:].lower() not in formats:
            args._parser.error(
                f"argument {flag}: the file type {image.suffix!r} of {str(image)!r} is not one "
                f"matplotlib writes ({', '.join('.' + f for f in sorted(formats))})"
            )


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

    rate_only = args.sample_rate is not None
    return {
        "dataset_size": None if rate_only else run.dataset_size,
        "batch_size": None if rate_only else run.batch_size,
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


def _run_title(run: Any, args: argparse.Namespace) -> str:
    data = (f"q={run.sampling_probability:.4g}" if args.sample_rate is not None
            else f"n={run.dataset_size}, B={run.batch_size}")
    return f"{data}, sigma={run.noise_multiplier:.3g}"


def _run_epsilon(args: argparse.Namespace) -> int:
    from dpsharp._report import epsilon_series, evaluate, print_statement

    run = _run_from_args(args)
    names = _accountant_names(args, args.accountant)
    if args.plot_classic and args.plot is None:
        args._parser.error("argument --plot-classic: needs --plot FILE.png")
    if args.plot is not None:
        _check_plot_flag(args, "--plot", image=args.plot)
    results = [evaluate(run, name, args.delta) for name in names]
    document: dict[str, Any] = {
        "inputs": _inputs(run, args),
        "accountants": {result.name: result.fields for result in results},
    }
    if args.plot is not None:
        from dpsharp import plots

        series = {}
        for result in results:
            if not result.applicable or (result.name in _PLOT_ONLY_WHEN_ASKED
                                         and not args.plot_classic):
                continue
            data = epsilon_series(run, result.name, args.delta)
            if data is not None:
                series[result.name] = data
        plots.epsilon_vs_epochs(
            series,
            delta=args.delta,
            certified={r.name: bool(r.fields.get("certified")) for r in results if r.applicable},
            title=f"{_run_title(run, args)}, T={run.steps}, {run.sampling}",
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
        print_statement(run, results, delta=args.delta, epochs=args.epochs,
                        sample_rate_only=args.sample_rate is not None)
        if args.plot is not None:
            left_out = [r.name for r in results if r.applicable and r.name not in series]
            print(f"Plot of epsilon against epochs written to {args.plot}"
                  + (f" (not drawn: {', '.join(left_out)}; --plot-classic draws the classic "
                     "bound)." if left_out else "."))
    return 0


# ---------------------------------------------------------------------------- calibrate
def _run_calibrate(args: argparse.Namespace) -> int:
    import dpsharp
    from dpsharp._report import RELATION_NAMES, evaluate, format_bound

    if args.accountant == "all":
        args._parser.error("argument --accountant: calibrate takes one accountant's name, not "
                           "'all'")
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
        certified = bool(result.fields.get("certified"))
        kind = "certified upper bound" if certified else "approximation"
        # significant digits: a target of 1e-9 read "achieved 0.000001" at six decimals
        achieved = format_bound(result.fields.get("epsilon"), ".7g",
                                side="upper" if certified else "nearest")
        relation = RELATION_NAMES[run.neighbouring.value]
        print(f"dpsharp {dpsharp.__version__} calibration ({name} accountant, {run.sampling} "
              f"sampling, {relation} neighbouring)")
        # rounded up: more noise only lowers epsilon, so the printed sigma meets the target too
        print(f"noise multiplier = {format_bound(sigma, '.6g', side='upper')}")
        print(
            f"achieved epsilon = {achieved} at "
            f"delta = {args.delta!r} "
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
            sampling_probability=template.sampling_probability,
        )
    except ValueError as exc:
        message = str(exc).replace("pass allow_approximation=True", "pass --allow-approximation")
        raise ValueError(message) from exc


# ---------------------------------------------------------------------------- curve
def _run_curve(args: argparse.Namespace) -> int:
    from dpsharp._report import HIDDEN_GDP_MU, format_bound, write_tradeoff_figure

    _check_plot_flag(args, "--output", image=args.output)
    run = _run_from_args(args)
    data = write_tradeoff_figure(run, args.delta, args.output,
                                 title=f"{_run_title(run, args)}, T={run.steps}")
    summary = {key: value for key, value in data.items() if not isinstance(value, list)}
    if args.json:
        document = {"inputs": _inputs(run, args), "output": str(args.output), **summary,
                    "curves": {key: value for key, value in data.items() if isinstance(value, list)}}
        print(json.dumps(document, indent=2, allow_nan=False))
    else:
        print(f"Trade-off curve written to {args.output}.")
        epsilon = format_bound(data["epsilon_pld"], ".4f", side="upper")
        print(f"epsilon({args.delta!r}) = {epsilon} (tight accountant, certified)")
        if data["gdp_mu_informative"]:
            mu = format_bound(data["gdp_mu_certified"], ".4g", side="upper")
            print(f"certified GDP mu = {mu} (proven: the curve lies above G_mu)")
        if "gdp_mu_clt" in data:
            print(f"central-limit GDP mu = {data['gdp_mu_clt']:.4g} (approximation)")
        if not data["gdp_mu_informative"]:
            print(HIDDEN_GDP_MU)
    return 0


# ---------------------------------------------------------------------------- accountants
def _summary(doc: str | None) -> str:
    """The first paragraph of a docstring on one line, ending at a whole sentence: where the
    paragraph runs on into a formula ("..., exactly: integer lambda = ..."), it ends before
    the colon."""
    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    if paragraph.endswith("."):
        return paragraph
    head, colon, _ = paragraph.partition(": ")
    return (head if colon else paragraph).rstrip(",;") + "."


def _run_accountants(args: argparse.Namespace) -> int:
    """Each accountant's description and, per sampling scheme of ``dpsharp epsilon``, whether
    its answer for a DP-SGD run is certified or an approximation (read from the guarantee it
    returns, e.g. zcdp: certified for reshuffling, an approximation for Poisson sampling)."""
    import dpsharp
    from dpsharp._dpsgd import SAMPLING_SCHEMES, DPSGDRun
    from dpsharp._report import evaluate

    names = dpsharp.available()
    width = max(len(name) for name in names)
    for name in names:
        kinds = []
        for sampling in SAMPLING_SCHEMES:
            fields = evaluate(DPSGDRun(1000, 10, 100, 1.0, sampling), name, 1e-5).fields
            kind = ("not applicable" if not fields["applicable"]
                    else "certified" if fields["certified"] else "approximation")
            kinds.append(f"{sampling} {kind}")
        cls = type(dpsharp.accountant(name))
        print(f"{name:<{width}}  {cls.__name__} [{', '.join(kinds)}]: {_summary(cls.__doc__)}")
    return 0


# ---------------------------------------------------------------------------- bench
def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _run_bench_precision(args: argparse.Namespace) -> int:
    """Progress on stderr; stdout is the markdown of results.md and nothing else."""
    import warnings

    from dpsharp.bench import precision

    grid = precision.load_grid(args.grid) if args.grid else list(precision.DEFAULT_GRID)
    _progress(f"dpsharp bench precision: {len(grid)} settings")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peers warn (opacus GDP is experimental, ...)
        results = precision.run_precision(grid, use_peers=not args.no_peers, progress=True)
    print(precision.markdown_document(results), end="")
    if args.output:
        files = precision.write_outputs(results, args.output)
        _progress("written: " + ", ".join(str(f) for f in files))
    return 0


def _run_bench_speed(args: argparse.Namespace) -> int:
    """Progress on stderr; stdout is the markdown of speed.md and nothing else."""
    import warnings

    from dpsharp.bench import speed

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = speed.run_speed(quick=args.quick, use_peers=not args.no_peers, progress=True)
    print(speed.markdown(results), end="")
    if args.output:
        files = speed.write_outputs(results, args.output)
        _progress("written: " + ", ".join(str(f) for f in files))
    return 0


# ---------------------------------------------------------------------------- parser
def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dpsharp", description="Privacy accounting for DP-SGD: "
                     "statements, calibration and plots from every dpsharp accountant.")
    parser.add_argument("--version", action="version", version=f"dpsharp {_version()}",
                        help="print the version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="the main job: DP training on digits, every accountant's "
                               "statement, plots")
    demo.add_argument("--output", type=_output_folder, default="dpsharp-demo", metavar="DIR",
                      help="folder for the plots and demo.json, created if missing "
                      "(default ./dpsharp-demo)")
    demo.add_argument("--epochs", type=_positive_int, default=20, help="epochs (default 20)")
    demo.add_argument("--target-epsilon", type=_positive_float, default=3.0, metavar="EPS",
                      help="privacy budget epsilon (default 3)")
    demo.add_argument("--delta", type=_delta, default=1e-5, help="target delta (default 1e-5)")
    demo.add_argument("--batch-size", type=_positive_int, default=256, help="expected batch size (default 256)")
    demo.add_argument("--lr", type=_positive_float, default=2e-2, help="Adam learning rate (default 0.02)")
    demo.add_argument("--max-grad-norm", type=_positive_float, default=1.0, help="clipping norm (default 1)")
    demo.add_argument("--seed", type=_non_negative_int, default=0,
                      help="random seed, an integer >= 0 (default 0)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.add_argument("--plot-classic", action="store_true",
                      help="also draw the classic composition bound in epsilon_vs_epoch.png "
                      "(far above the others: the axis turns logarithmic)")
    demo.set_defaults(handler=_run_demo, _parser=demo)

    epsilon = commands.add_parser("epsilon", help="privacy statement of a DP-SGD run")
    _add_run_flags(epsilon)
    epsilon.add_argument("--accountant", nargs="+", metavar="NAME", default=["all"],
                         help="accountants to ask (names, or 'all', the default)")
    epsilon.add_argument("--json", action="store_true", help="print one JSON object")
    epsilon.add_argument("--plot", type=_output_file, metavar="FILE.png",
                         help="also draw epsilon against epochs (every applicable accountant "
                         "but the classic bound)")
    epsilon.add_argument("--plot-classic", action="store_true",
                         help="with --plot: also draw the classic composition bound (far "
                         "above the others: the axis turns logarithmic)")
    epsilon.set_defaults(handler=_run_epsilon, _parser=epsilon)

    calibrate = commands.add_parser("calibrate", help="noise multiplier for a target epsilon")
    calibrate.add_argument("--target-epsilon", type=_positive_float, required=True, metavar="EPS",
                           help="the epsilon to reach at --delta; the answer's epsilon is at "
                           "most this (conservative)")
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
    curve.add_argument("--output", type=_output_file, required=True, metavar="FILE.png",
                       help="where to write the figure (its folder must exist)")
    curve.add_argument("--json", action="store_true", help="also print the curves as JSON")
    curve.set_defaults(handler=_run_curve, _parser=curve)

    bench = commands.add_parser("bench", help="benchmarks against the peer libraries")
    benches = bench.add_subparsers(dest="bench", required=True, metavar="BENCH")
    precision = benches.add_parser("precision", help="epsilon, bounds, time and gap of every accountant")
    precision.add_argument("--output", type=_output_folder, metavar="DIR",
                           help="write results.json/.csv/.md and precision.png here")
    precision.add_argument("--grid", type=_input_file, metavar="FILE.json",
                           help="settings: a JSON list of {q, sigma, steps, delta?, name?}")
    precision.add_argument("--no-peers", action="store_true", help="dpsharp's accountants only")
    precision.set_defaults(handler=_run_bench_precision, _parser=precision)
    speed = benches.add_parser("speed", help="query time against the peers, scaling in T and sigmas")
    speed.add_argument("--output", type=_output_folder, metavar="DIR",
                       help="write speed.json/.md/.png here")
    speed.add_argument("--quick", action="store_true",
                       help="under a minute: T up to 10^5, k up to 16 sigmas, 3 repeats, and a "
                       "call over 1 s is timed once and ends that accountant's sweep")
    speed.add_argument("--no-peers", action="store_true", help="dpsharp's accountants only")
    speed.set_defaults(handler=_run_bench_speed, _parser=speed)

    listing = commands.add_parser("accountants", help="list the registered accountants")
    listing.set_defaults(handler=_run_accountants, _parser=listing)
    _add_audit_command(commands)
    return parser


# ---------------------------------------------------------------------------- audit
def _add_audit_command(commands: Any) -> None:
    audit = commands.add_parser("audit", help="one-run privacy audit of DP-SGD with canaries")
    audit.add_argument("--noise-multiplier", type=_non_negative_float, default=2.0, metavar="S",
                       help="noise std / clipping bound (default 2)")
    audit.add_argument("--max-grad-norm", type=_positive_float, default=1.0, metavar="C",
                       help="clipping bound (default 1)")
    audit.add_argument("--steps", type=_positive_int, default=100, metavar="T",
                       help="noisy steps (default 100)")
    audit.add_argument("--sample-rate", type=_probability, default=0.05, metavar="Q",
                       help="Poisson sampling rate (default 0.05)")
    audit.add_argument("--canaries", type=_at_least_two, default=1000, metavar="M",
                       help="gradient canaries, each included with probability 1/2 (default 1000)")
    audit.add_argument("--canary-type", choices=("gradient", "input"), default="gradient",
                       help="white-box gradient canaries, or input-space canaries scored from "
                       "the final model only (black-box; weaker) (default gradient)")
    audit.add_argument("--confidence", type=_open_unit, default=0.95, metavar="P",
                       help="confidence of the lower bound, in (0, 1) (default 0.95)")
    audit.add_argument("--delta", type=_delta, default=1e-5, help="delta (default 1e-5)")
    audit.add_argument("--seed", type=_non_negative_int, default=0,
                       help="random seed, an integer >= 0 (default 0)")
    audit.add_argument("--json", action="store_true", help="print one JSON object")
    audit.add_argument("--plot", type=_output_file, metavar="FILE.png",
                       help="also draw the canaries' scores")
    audit.add_argument("--no-progress", action="store_true", help="no progress bar")
    audit.set_defaults(handler=_run_audit, _parser=audit)


def _run_audit(args: argparse.Namespace) -> int:
    from dpsharp.torch.audit import audit_digits

    if args.plot:
        _check_plot_flag(args, "--plot", image=args.plot)
    result = audit_digits(
        noise_multiplier=args.noise_multiplier, max_grad_norm=args.max_grad_norm,
        steps=args.steps, sample_rate=args.sample_rate, delta=args.delta,
        canaries=args.canaries, confidence=args.confidence, seed=args.seed,
        progress=not args.no_progress, canary_type=args.canary_type,
    )
    if args.json:
        score, k, correct, _ = result.best
        print(json.dumps({
            "epsilon_lower": result.epsilon_lower, "epsilon_upper": result.epsilon_upper,
            "passed": result.passed, "certified": result.certified,
            "confidence": result.confidence, "delta": result.delta,
            "canaries": result.canaries, "included": result.included, "steps": result.steps,
            "best": {"score": score, "k": k, "correct": correct, "guesses": 2 * k},
            "canary_type": result.canary_type, "cross_example": result.cross_example,
        }))
    else:
        print(result.summary())
    if args.plot:
        result.plot(args.plot)
    return 0 if result.passed else 1


def _version() -> str:
    from dpsharp import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 1 a failed audit, 2 usage error,
    bad input, a value out of a computation's range or a file that cannot be read or written:
    one line on stderr, no traceback)."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except (ValueError, TypeError, ImportError, OSError, ArithmeticError) as exc:
        if isinstance(exc, OSError) and exc.filename is not None:
            text = f"{exc.strerror or exc}: {exc.filename!r}"
        elif isinstance(exc, (OverflowError, ZeroDivisionError)):
            text = (f"a value is outside the range this computation supports "
                    f"({type(exc).__name__}: {exc}); use smaller or larger values")
        else:
            text = str(exc)
        message = " ".join(text.split())
        print(f"dpsharp {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

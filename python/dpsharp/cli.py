"""The ``dpsharp`` command.

Sub-commands:

``dpsharp demo``
    The main job. For now: a privacy report of the two classic settings of Abadi et al. 2016
    (MNIST: q = 256/60000, sigma = 1.1, 60 epochs; the moments-accountant example q = 0.01,
    sigma = 4, T = 10^4) under every registered accountant, at delta = 1e-5.

Usage errors print one line naming the flag and exit with status 2.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Sequence

__all__ = ["main"]


def _demo_settings() -> list[tuple[str, float, float, int]]:
    mnist_q = 256 / 60000
    return [
        ("MNIST, batch 256, sigma 1.1, 60 epochs", mnist_q, 1.1, round(60 * 60000 / 256)),
        ("q 0.01, sigma 4, 10^4 steps (Abadi et al.)", 0.01, 4.0, 10_000),
    ]


def _run_demo(args: argparse.Namespace) -> int:
    import dpsharp

    delta = args.delta
    print(f"dpsharp {dpsharp.__version__}: privacy of Poisson-sampled DP-SGD at delta = {delta:g}")
    print("(add/remove-one neighbouring relation; every accountant sees the same events)\n")
    names = dpsharp.available()
    for title, q, sigma, steps in _demo_settings():
        event = dpsharp.PoissonSampled(dpsharp.Gaussian(sigma), q)
        print(f"{title}: q = {q:.6g}, sigma = {sigma:g}, T = {steps}")
        for name in names:
            acc = dpsharp.accountant(name)
            if not acc.supports(event):
                continue
            guarantee = acc.compose(event, steps).guarantee(delta)
            kind = "certified upper bound" if guarantee.certified else "approximation"
            extra = "".join(f", {key} = {value:.4g}" for key, value in guarantee.details.items()
                            if isinstance(value, (int, float)) and math.isfinite(value))
            print(f"  {name:<10} epsilon = {guarantee.epsilon:8.4f}  ({kind}{extra})")
        print()
    return 0


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpsharp", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="the main job: a privacy report of classic settings")
    demo.add_argument("--delta", type=float, default=1e-5, help="target delta (default 1e-5)")
    demo.set_defaults(handler=_run_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args))
    except (ValueError, TypeError) as exc:
        print(f"dpsharp {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())

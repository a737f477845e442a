"""How much the clipping's round-off bounds raise a per-example norm on ordinary data.

A linear layer on its Gram path (python/dpsharp/torch/layers/usages.py,
LinearUsage.sq_norm_and_slack): the norm the clipper uses is the float64 ghost norm raised by the
Grams' round-off bound and by the clipped sum's (kappa_T sum_t ||a_t|| ||g_t||). This prints
used / exact - 1 for one example of independent Gaussian positions (no cancellation), per route:
float32 products, TF32 (operands rounded to 10 bits, as a GPU with TF32 enabled), and the GPU's
split bfloat16 route (bfloat16 stored tensors; the GPU's ``bmm(..., out_dtype=float32)`` is
emulated on the CPU, which only matters for which bound is chosen, not for its size).

Run:  python bench/bench_clip_slack.py [--features 64 768]
"""

from __future__ import annotations

import argparse
from unittest import mock

import torch
from dpsharp.torch.layers import usages


def raise_of_norm(positions: int, features: int, route: str) -> float:
    gen = torch.Generator().manual_seed(positions)
    a = torch.randn(1, positions, features, generator=gen)
    g = torch.randn(1, positions, features, generator=gen)
    if route == "split bf16":
        a, g = a.bfloat16(), g.bfloat16()
    exact = float(torch.einsum("btp,btd->pd", g.double(), a.double()).norm())
    operand = 2.0**-10 if route == "TF32" else 0.0
    with mock.patch.object(usages, "_bmm_has_out_dtype", lambda device: route == "split bf16"), \
            mock.patch.object(usages, "_float32_operand_roundoff", lambda device: operand), \
            mock.patch.object(usages.LinearUsage, "_materialise_weight", lambda self: False):
        weight = torch.nn.Parameter(torch.zeros(features, features))
        used = float(usages.LinearUsage(weight, None, a, g).sq_norm(weight).sqrt()[0])
    return used / exact - 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--features", nargs="+", type=int, default=[64, 768])
    ap.add_argument("--positions", nargs="+", type=int, default=[16, 128, 1024, 4096])
    args = ap.parse_args()
    print("| d = p | route | " + " | ".join(f"T = {t}" for t in args.positions) + " |")
    print("|---|---|" + "---|" * len(args.positions))
    for features in args.features:
        for route in ("float32", "TF32", "split bf16"):
            cells = [f"{raise_of_norm(t, features, route):.1e}" for t in args.positions]
            print(f"| {features} | {route} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

"""How much the clipping's round-off bounds raise a per-example norm on ordinary data.

A linear layer on its Gram path (python/dpsharp/torch/layers/usages.py,
LinearUsage.sq_norm_and_slack): the norm the clipper uses is the ghost norm raised by the
Grams' round-off bound and by the clipped sum's (kappa_T sum_t ||a_t|| ||g_t||). This prints
used / exact - 1 for one example of independent Gaussian positions (no cancellation), per route:
float32 products (the fused CPU kernel's Gram entries accumulated in float64), float32 blocks
(the same with the kernel's float32-block accumulation, usages._FUSED_GRAM_ACCUMULATION =
'float32_blocks', raised by usages.blocked_gram_roundoff), TF32 (operands rounded to 10 bits, as
a GPU with TF32 enabled), and the GPU's split bfloat16 route (bfloat16 stored tensors; the GPU's
``bmm(..., out_dtype=float32)`` is emulated on the CPU, which only matters for which bound is
chosen, not for its size). A second table isolates the Grams' own raise (the norm before the
clipped sum's slack) for the two accumulations of the fused kernel.

Run:  python bench/bench_clip_slack.py [--features 64 768]
"""

from __future__ import annotations

import argparse
from unittest import mock

import torch
from dpsharp.torch.layers import usages


def raise_of_norm(positions: int, features: int, route: str, gram_only: bool = False) -> float:
    gen = torch.Generator().manual_seed(positions)
    a = torch.randn(1, positions, features, generator=gen)
    g = torch.randn(1, positions, features, generator=gen)
    if route == "split bf16":
        a, g = a.bfloat16(), g.bfloat16()
    exact = float(torch.einsum("btp,btd->pd", g.double(), a.double()).norm())
    operand = 2.0**-10 if route == "TF32" else 0.0
    accumulation = "float32_blocks" if route == "float32 blocks" else "float64"
    with mock.patch.object(usages, "_bmm_has_out_dtype", lambda device: route == "split bf16"), \
            mock.patch.object(usages, "_float32_operand_roundoff", lambda device: operand), \
            mock.patch.object(usages, "_FUSED_GRAM_ACCUMULATION", accumulation), \
            mock.patch.object(usages.LinearUsage, "_materialise_weight", lambda self: False):
        weight = torch.nn.Parameter(torch.zeros(features, features))
        usage = usages.LinearUsage(weight, None, a, g)
        if gram_only:
            used = float(usage.sq_norm_and_slack(weight)[0].sqrt()[0])
        else:
            used = float(usage.sq_norm(weight).sqrt()[0])
    return used / exact - 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--features", nargs="+", type=int, default=[64, 768])
    ap.add_argument("--positions", nargs="+", type=int, default=[16, 128, 256, 1024, 4096])
    args = ap.parse_args()
    header = ("| d = p | route | " + " | ".join(f"T = {t}" for t in args.positions) + " |\n"
              + "|---|---|" + "---|" * len(args.positions))
    print("Used norm (Grams' and clipped sum's raises):\n")
    print(header)
    for features in args.features:
        for route in ("float32", "float32 blocks", "TF32", "split bf16"):
            cells = [f"{raise_of_norm(t, features, route):.1e}" for t in args.positions]
            print(f"| {features} | {route} | " + " | ".join(cells) + " |", flush=True)
    print("\nThe Grams' raise alone (fused CPU kernel, before the clipped sum's slack):\n")
    print(header.replace("| route |", "| accumulation |"))
    for features in args.features:
        for route, name in (("float32", "float64"), ("float32 blocks", "float32 blocks")):
            cells = [f"{raise_of_norm(t, features, route, gram_only=True):.1e}"
                     for t in args.positions]
            print(f"| {features} | {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()

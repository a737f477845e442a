"""Per-example norm kernels against the torch code they replace, in one process.

Sections (each timing interleaves the old and the new path call by call, with a 64 MiB buffer
written between calls so that every call starts, as in a training step, with its inputs out of
the caches; min and median over ``--repeats`` calls; ratio = old / new):

linear     LinearUsage's Gram norms of weight and bias for T > 1: before, two batched Gram
           matmuls + kernels.per_example_dots + g.sum(dim=1) + kernels.per_example_sq_norms;
           now kernels.linear_sequence_sq_norms (one fused pass over the pairs t <= s). The
           bench transformer's four shapes first (bench_training.py: B = 64, T = 64).
embedding  EmbeddingUsage's norms and clipped sum: before, torch.unique + index_add (norms)
           and a scaled copy + index_add_ into zeros (clipped sum); now
           kernels.embedding_sq_norms / embedding_clipped_sum.
real       both, on the activations / output gradients / indices that one DP step of the bench
           transformer records (are the kernels slowed by the real values, e.g. denormals?).
denormal   the linear kernel and the old path on inputs scaled so that the float32 Gram
           products are denormal (slow paths in the CPU's FMA units).
rule       LinearUsage end to end (norms and clipped sums of weight and bias) on the Gram path
           and materialised, and which one LinearUsage._materialise_weight picks.

Every timed pair is also checked for agreement (max relative difference of the norms).

Run:  python bench/bench_norm_kernels.py --threads 1 2
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from dpsharp.torch import kernels
from dpsharp.torch.layers import usages

FLUSH = torch.empty(64 * 2**20 // 4)


def interleaved(fns: list[Callable[[], object]], repeats: int, cold: bool = True,
                ) -> list[tuple[float, float]]:
    """(min, median) milliseconds of each function, called in turn ``repeats`` times."""
    for fn in fns:
        fn()  # warm-up (allocator, code)
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for k, fn in enumerate(fns):
            if cold:
                FLUSH.fill_(1.0)
            t0 = time.perf_counter()
            fn()
            times[k].append((time.perf_counter() - t0) * 1e3)
    return [(min(t), statistics.median(t)) for t in times]


def rel_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    if x.numel() == 0:
        return 0.0
    return float(((x - y).abs() / y.abs().clamp_min(1e-300)).max())


# ------------------------------------------------------------------------------- linear


def linear_old(a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """LinearUsage's T > 1 Gram path before the fused kernel (weight and bias norms)."""
    gram_a = torch.bmm(a, a.transpose(1, 2))
    gram_g = torch.bmm(g, g.transpose(1, 2))
    weight_sq = kernels.per_example_dots(gram_a, gram_g)
    bias_sq = kernels.per_example_sq_norms(g.sum(dim=1))
    return weight_sq, bias_sq


def linear_new(a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    return kernels.linear_sequence_sq_norms(a, g, bias=True)


def linear_row(label: str, a: torch.Tensor, g: torch.Tensor, repeats: int) -> str:
    (old_min, old_med), (new_min, new_med) = interleaved(
        [lambda: linear_old(a, g), lambda: linear_new(a, g)], repeats)
    old_w, old_b = linear_old(a, g)
    new_w, new_b = linear_new(a, g)
    assert new_b is not None
    diff = max(rel_diff(new_w, old_w), rel_diff(new_b, old_b))
    return (f"| {label} | {old_min:.3f} / {old_med:.3f} | {new_min:.3f} / {new_med:.3f} | "
            f"{old_min / new_min:.2f} / {old_med / new_med:.2f} | {diff:.1e} |")


LINEAR_HEADER = ("| (B, T, d, p) | old ms (min / median) | kernel ms (min / median) | "
                 "old / kernel (min / median) | max rel diff |\n|---|---|---|---|---|")

LINEAR_SHAPES = [
    # the bench transformer: qkv, proj, fc1, fc2
    (64, 64, 128, 384), (64, 64, 128, 128), (64, 64, 128, 512), (64, 64, 512, 128),
    # shorter / longer sequences, sizes off the tiles and vectors, a GPT-2-sized layer
    (256, 16, 128, 384), (32, 128, 128, 128), (64, 50, 100, 300), (8, 128, 768, 768),
]


def section_linear(repeats: int) -> None:
    print(LINEAR_HEADER)
    gen = torch.Generator().manual_seed(0)
    for batch, seq, d, p in LINEAR_SHAPES:
        a = torch.randn(batch, seq, d, generator=gen)
        g = torch.randn(batch, seq, p, generator=gen) * 1e-5  # the bench's gradient scale
        print(linear_row(f"({batch}, {seq}, {d}, {p})", a, g, repeats), flush=True)


# ---------------------------------------------------------------------------- embedding


def embedding_old_norms(idx: torch.Tensor, g: torch.Tensor, num_rows: int) -> torch.Tensor:
    """EmbeddingUsage.sq_norm before the kernels (g with padding positions zeroed)."""
    b, t, d = g.shape
    keys = (torch.arange(b).unsqueeze(1) * num_rows + idx).reshape(-1)
    unique_keys, inverse = torch.unique(keys, return_inverse=True)
    if unique_keys.numel() == keys.numel():
        rows_sq = kernels.per_example_sq_norms(g.reshape(b * t, d))
        return rows_sq.reshape(b, t).sum(dim=1)
    rows = torch.zeros(unique_keys.numel(), d, dtype=torch.float64)
    rows.index_add_(0, inverse, g.reshape(-1, d).double())
    out = torch.zeros(b, dtype=torch.float64)
    return out.index_add_(0, unique_keys // num_rows, (rows * rows).sum(dim=1))


def embedding_old_sum(idx: torch.Tensor, g: torch.Tensor, factors: torch.Tensor,
                      num_rows: int) -> torch.Tensor:
    """EmbeddingUsage.clipped_sum before the kernels."""
    d = g.shape[2]
    scaled = (g * factors.to(g.dtype)[:, None, None]).reshape(-1, d)
    out = torch.zeros(num_rows, d, dtype=g.dtype)
    return out.index_add_(0, idx.reshape(-1), scaled)


def embedding_rows(label: str, idx: torch.Tensor, g: torch.Tensor, num_rows: int,
                   repeats: int) -> list[str]:
    factors = torch.rand(idx.shape[0], dtype=torch.float64)
    rows = []
    (o_min, o_med), (n_min, n_med) = interleaved(
        [lambda: embedding_old_norms(idx, g, num_rows),
         lambda: kernels.embedding_sq_norms(idx, g, num_rows=num_rows)], repeats)
    diff = rel_diff(kernels.embedding_sq_norms(idx, g, num_rows=num_rows),
                    embedding_old_norms(idx, g, num_rows))
    rows.append(f"| {label} | norms | {o_min:.3f} / {o_med:.3f} | {n_min:.3f} / {n_med:.3f} | "
                f"{o_min / n_min:.2f} / {o_med / n_med:.2f} | {diff:.1e} |")
    (o_min, o_med), (n_min, n_med) = interleaved(
        [lambda: embedding_old_sum(idx, g, factors, num_rows),
         lambda: kernels.embedding_clipped_sum(idx, g, factors, num_rows=num_rows)], repeats)
    new = kernels.embedding_clipped_sum(idx, g, factors, num_rows=num_rows)
    old = embedding_old_sum(idx, g, factors, num_rows)
    diff = float((new - old).abs().max() / old.abs().max().clamp_min(1e-300))
    rows.append(f"| {label} | clipped sum | {o_min:.3f} / {o_med:.3f} | {n_min:.3f} / "
                f"{n_med:.3f} | {o_min / n_min:.2f} / {o_med / n_med:.2f} | {diff:.1e} |")
    return rows


EMBEDDING_HEADER = ("| (B, T, rows, d) | what | old ms (min / median) | kernel ms (min / median) "
                    "| old / kernel (min / median) | max rel diff |\n|---|---|---|---|---|---|")


def section_embedding(repeats: int) -> None:
    print(EMBEDDING_HEADER)
    gen = torch.Generator().manual_seed(1)
    cases = [
        ("token (64, 64, 10000, 128)", torch.randint(0, 10_000, (64, 64), generator=gen),
         10_000),
        ("position (64, 64, 64, 128)", torch.arange(64).repeat(64, 1), 64),
        ("repeats (64, 64, 50, 128)", torch.randint(0, 50, (64, 64), generator=gen), 50),
        ("long (16, 512, 32000, 256)", torch.randint(0, 32_000, (16, 512), generator=gen),
         32_000),
    ]
    for label, idx, num_rows in cases:
        d = int(label.rsplit(",", 1)[1].strip(" )"))
        g = torch.randn(*idx.shape, d, generator=gen) * 1e-5
        for row in embedding_rows(label, idx, g, num_rows, repeats):
            print(row, flush=True)


# ------------------------------------------------------------------------------- real


def capture_transformer_usages() -> list[object]:
    """The usages one DP step of bench_training.py's transformer records (after 3 steps)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_training import build_step, make

    captured: list[object] = []
    recording = [False]
    originals = {cls: cls.__init__ for cls in (usages.LinearUsage, usages.EmbeddingUsage)}

    def recorder(init: Callable[..., None]) -> Callable[..., None]:
        def wrapped(self: object, *args: object, **kwargs: object) -> None:
            init(self, *args, **kwargs)
            if recording[0]:
                captured.append(self)
        return wrapped

    for cls, init in originals.items():
        cls.__init__ = recorder(init)  # type: ignore[method-assign]
    model, x, y = make("transformer")
    step = build_step("dpsharp", model, x, y)
    for _ in range(3):
        step()
    recording[0] = True
    step()
    for cls, init in originals.items():
        cls.__init__ = init  # type: ignore[method-assign]
    return captured


def section_real(repeats: int) -> None:
    captured = capture_transformer_usages()
    tiny = torch.finfo(torch.float32).tiny
    print(LINEAR_HEADER.replace("(B, T, d, p)", "layer (B, T, d, p), min |g|, denormal g"))
    seen = 0
    for u in captured:
        if isinstance(u, usages.LinearUsage) and u.a.shape[1] > 1:
            seen += 1
            a, g = u.a, u.g
            nonzero = g[g != 0].abs()
            smallest = float(nonzero.min()) if nonzero.numel() else 0.0
            denormal = int(((g != 0) & (g.abs() < tiny)).sum())
            label = (f"{seen}: {tuple(a.shape) + (g.shape[2],)}, {smallest:.1e}, {denormal}")
            print(linear_row(label, a, g, repeats), flush=True)
    print()
    print(EMBEDDING_HEADER)
    for u in captured:
        if isinstance(u, usages.EmbeddingUsage):
            num_rows = int(u.weight.shape[0])
            label = f"{tuple(u.idx.shape) + (num_rows, u.g.shape[2])}"
            for row in embedding_rows(label, u.idx.contiguous(), u.g.contiguous(), num_rows,
                                      repeats):
                print(row, flush=True)


# ---------------------------------------------------------------------------- denormal


def section_denormal(repeats: int) -> None:
    print("| input scale | old ms (min) | kernel ms (min) | old / kernel | kernel vs scale 1 |\n"
          "|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(2)
    a0 = torch.randn(64, 64, 128, generator=gen)
    g0 = torch.randn(64, 64, 384, generator=gen)
    base = None
    for scale in (1.0, 1e-5, 1e-19, 1e-21):
        a, g = a0 * scale, g0 * scale
        (old, _), (new, _) = interleaved(
            [lambda a=a, g=g: linear_old(a, g), lambda a=a, g=g: linear_new(a, g)],
            max(3, repeats // 5))
        base = new if base is None else base
        print(f"| {scale:g} | {old:.3f} | {new:.3f} | {old / new:.2f} | {new / base:.1f}x |",
              flush=True)


# ------------------------------------------------------------------------------- rule


def rule_total(a: torch.Tensor, g: torch.Tensor, weight: torch.nn.Parameter,
               bias: torch.nn.Parameter, materialise: bool) -> Callable[[], None]:
    factors = torch.rand(a.shape[0], dtype=torch.float64)

    def run() -> None:
        u = usages.LinearUsage(weight, bias, a, g, 64.0)
        u._materialise_weight = lambda: materialise  # type: ignore[method-assign]
        u.sq_norm(weight)
        u.sq_norm(bias)
        u.clipped_sum(weight, factors)
        u.clipped_sum(bias, factors)

    return run


def section_rule(repeats: int) -> None:
    print("| (d, p) | T | B | k = T^2 (d + p) / (2 d p) | Gram ms | materialised ms | "
          "materialised / Gram | rule picks |\n|---|---|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(3)
    for d, p in [(128, 128), (128, 512), (512, 128), (64, 64), (256, 256), (32, 512)]:
        weight = torch.nn.Parameter(torch.empty(p, d))
        bias = torch.nn.Parameter(torch.empty(p))
        for seq in (8, 16, 32, 64, 128, 256):
            batch = max(4, 4096 // seq)
            a = torch.randn(batch, seq, d, generator=gen)
            g = torch.randn(batch, seq, p, generator=gen)
            (gram, _), (mat, _) = interleaved(
                [rule_total(a, g, weight, bias, False), rule_total(a, g, weight, bias, True)],
                max(3, repeats // 5))
            picks = "materialised" if usages.LinearUsage(
                weight, bias, a, g)._materialise_weight() else "Gram"
            k = seq * seq * (d + p) / (2 * d * p)
            print(f"| ({d}, {p}) | {seq} | {batch} | {k:.1f} | {gram:.3f} | {mat:.3f} | "
                  f"{mat / gram:.2f} | {picks} |", flush=True)


SECTIONS = {"linear": section_linear, "embedding": section_embedding, "real": section_real,
            "denormal": section_denormal, "rule": section_rule}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    print(f"torch {torch.__version__}, linear kernel implementation "
          f"'{kernels.linear_norms_implementations()[0]}', repeats {args.repeats}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for name in args.sections:
            if name in ("denormal", "rule") and threads != args.threads[0]:
                continue  # single-thread sections
            print(f"\n## {name}, {threads} thread{'s' if threads > 1 else ''}\n")
            SECTIONS[name](args.repeats)


if __name__ == "__main__":
    main()

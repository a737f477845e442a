"""GPU benchmarks of the DP training stack, on one CUDA device (``--dry-run`` on a CPU only
checks that every mode builds and steps). Results: bench/results/gpu.md.

1. Throughput (examples/s) of one training step, same model and batch, same run, modes
   interleaved in rounds (median over rounds):
     nonprivate    plain AdamW step
     dpsharp       PerSampleClipper (ghost norms / book-keeping, CUDA fused noise kernel) + AdamW
     opacus-ghost  Opacus 1.6 GradSampleModuleFastGradientClipping(use_ghost_clipping=True)
   Models (synthetic data; step time does not depend on the values):
     gpt2s     GPT-2-small-sized causal LM: 12 pre-LN blocks, d=768, 12 heads, FFN 3072,
               vocab 50257 (untied LM head: tied weights would need materialised per-example
               embedding gradients), seq 256, batch 32, built from nn.Embedding / nn.Linear /
               nn.LayerNorm
     resnet18  ResNet-18-sized CNN with GroupNorm(32) instead of BatchNorm (BatchNorm mixes
               examples and is refused), 32x32x3 inputs, batch 256, 10 classes
   Targets: dpsharp >= 0.9x non-private throughput (book-keeping's published figure is about
   0.83x: Bu, Wang, Zha, Karypis 2023) and >= 1.5x Opacus ghost clipping.
   ``--amp bf16|fp16`` runs the forward under torch.autocast (norms stay float32/64).
2. Peak memory of each mode, measured alone (one mode built at a time, two steps, CUDA
   allocator's peak): target dpsharp <= 1.3x non-private.
3. Fused noise pass bandwidth: ``out = scale * (out + sigma C z)`` over N float32 elements with
   z drawn in-kernel (reads and writes 4N bytes each) against ``dst.copy_(src)`` of the same N
   (also 8N bytes), the achievable memory roofline; target: >= 70% of it.

Run (H100/H200, after ``pip install . -Ccmake.define.DPSHARP_CUDA=ON``):
    python bench/bench_gpu.py --out bench/results/gpu.md
    python bench/bench_gpu.py --amp bf16 --out bench/results/gpu_bf16.md
"""

from __future__ import annotations

import argparse
import gc
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from bench_training import Block  # the same pre-LN layer, causal here

SIGMA, C, LR = 1.0, 1.0, 1e-4


# --------------------------------------------------------------------------------- models
class GPT2Small(nn.Module):
    def __init__(self, vocab: int = 50257, dim: int = 768, layers: int = 12, heads: int = 12,
                 seq: int = 256) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads, 4 * dim, causal=True) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device).unsqueeze(0).expand_as(idx)
        h = self.blocks(self.tok(idx) + self.pos(pos.contiguous()))
        return self.head(self.ln(h))


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.n1 = nn.GroupNorm(32, cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.n2 = nn.GroupNorm(32, cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.GroupNorm(32, cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.n1(self.c1(x)))
        out = self.n2(self.c2(out))
        return F.relu(out + (x if self.short is None else self.short(x)))


class ResNet18GN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
        self.norm = nn.GroupNorm(32, 64)
        layers, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.layers(F.relu(self.norm(self.stem(x))))
        return self.fc(h.mean(dim=(2, 3)))


def make(name: str, device: str, batch: int | None, small: bool):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if name == "gpt2s":
        b, seq = batch or 32, 256
        kw = {"vocab": 1000, "dim": 64, "layers": 2, "heads": 4, "seq": 16} if small else {}
        if small:
            b, seq = 4, 16
        model = GPT2Small(**kw)
        vocab = model.tok.num_embeddings
        x = torch.randint(0, vocab, (b, seq), generator=g)
        y = torch.randint(0, vocab, (b, seq), generator=g)

        def loss_fn(out: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
            # mean over tokens of each example, then over examples (loss_reduction="mean")
            return F.cross_entropy(out.float().reshape(-1, out.shape[-1]), tgt.reshape(-1))
    elif name == "resnet18":
        b = 4 if small else (batch or 256)
        model = ResNet18GN()
        x = torch.randn(b, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (b,), generator=g)

        def loss_fn(out: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(out.float(), tgt)
    else:
        raise ValueError(name)
    return model.to(device), x.to(device), y.to(device), loss_fn


# --------------------------------------------------------------------------------- steps
def build_step(mode: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn,
               amp: torch.dtype | None) -> Callable[[], None]:
    batch = x.shape[0]
    device_type = x.device.type

    def forward(m: nn.Module) -> torch.Tensor:
        if amp is None:
            return m(x)
        with torch.autocast(device_type, dtype=amp):
            return m(x)

    if mode == "nonprivate":
        opt = torch.optim.AdamW(model.parameters(), lr=LR)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss_fn(forward(model), y).backward()
            opt.step()
        return step
    if mode == "dpsharp":
        from dpsharp.torch import NoiseGenerator, PerSampleClipper

        clipper = PerSampleClipper(model, max_grad_norm=C)
        noise = NoiseGenerator(0)
        opt = torch.optim.AdamW(clipper.parameters, lr=LR)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss_fn(forward(model), y).backward()
            clipper.release(noise_multiplier=SIGMA, expected_batch_size=batch, noise=noise)
            opt.step()
        return step
    if mode == "opacus-ghost":
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

        gsm = GradSampleModuleFastGradientClipping(model, max_grad_norm=C,
                                                   use_ghost_clipping=True)
        opt = DPOptimizerFastGradientClipping(
            torch.optim.AdamW(gsm.parameters(), lr=LR), noise_multiplier=SIGMA, max_grad_norm=C,
            expected_batch_size=batch)

        class _Loss(nn.Module):
            def forward(self, out: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
                return loss_fn(out, tgt)

        crit = DPLossFastGradientClipping(gsm, opt, _Loss())

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            crit(forward(gsm), y).backward()
            opt.step()
        return step
    raise ValueError(mode)


MODES = ["nonprivate", "dpsharp", "opacus-ghost"]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_modes(name: str, device: str, steps: int, rounds: int, batch: int | None,
               amp: torch.dtype | None, small: bool) -> tuple[dict[str, float], int]:
    runners, b = {}, 0
    for mode in MODES:
        try:
            model, x, y, loss_fn = make(name, device, batch, small)
            b = x.shape[0]
            runners[mode] = build_step(mode, model, x, y, loss_fn, amp)
            for _ in range(3):
                runners[mode]()
            sync(device)
        except Exception as exc:  # noqa: BLE001 - a peer failing must not hide our numbers
            print(f"  {name}/{mode}: failed to build or step: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
    samples: dict[str, list[float]] = {m: [] for m in runners}
    for _ in range(rounds):
        for mode, run in runners.items():
            sync(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                run()
            sync(device)
            samples[mode].append((time.perf_counter() - t0) / steps)
    return {m: statistics.median(v) for m, v in samples.items()}, b


def peak_memory(name: str, device: str, batch: int | None, amp: torch.dtype | None,
                small: bool) -> dict[str, float]:
    """Peak allocated bytes of each mode measured alone: model, optimizer state, activations and
    the mode's own buffers, over two steps after one warm-up step."""
    peaks: dict[str, float] = {}
    for mode in MODES:
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() if device == "cuda" else 0
        try:
            model, x, y, loss_fn = make(name, device, batch, small)
            run = build_step(mode, model, x, y, loss_fn, amp)
            for _ in range(3):
                run()
            sync(device)
            if device == "cuda":
                peaks[mode] = float(torch.cuda.max_memory_allocated() - base)
        except Exception as exc:  # noqa: BLE001 - a peer failing must not hide our numbers
            print(f"  {name}/{mode}: memory run failed: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
        finally:
            run = model = x = y = None  # type: ignore[assignment]
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return peaks


# --------------------------------------------------------------------------------- bandwidth
def noise_bandwidth(device: str, numel: int, reps: int) -> tuple[float, float]:
    """(fused noise pass GB/s, copy GB/s), both counting 8 bytes per float32 element."""
    from dpsharp.torch import kernels

    out = torch.zeros(numel, dtype=torch.float32, device=device)
    src = torch.randn(numel, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)

    def fused() -> None:
        kernels.clip_accumulate_noise(out, base=out, noise_std=SIGMA * C, key=1, parameter=0,
                                      release=0, rank=0, scale=1.0 / 256)

    def copy() -> None:
        dst.copy_(src)

    result = []
    for fn in (fused, copy):
        for _ in range(3):
            fn()
        sync(device)
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            sync(device)
            times.append(time.perf_counter() - t0)
        result.append(8.0 * numel / min(times) / 1e9)
    return result[0], result[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="*", default=["gpt2s", "resnet18"],
                    help="models to train (none: only the noise-pass bandwidth)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--amp", choices=["none", "bf16", "fp16"], default="none")
    ap.add_argument("--numel", type=int, default=1 << 28, help="elements of the bandwidth test")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny models on the CPU: only checks that every mode builds and steps")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    amp = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[args.amp]

    if args.dry_run:
        device = "cpu"
    else:
        if not torch.cuda.is_available():
            sys.exit("bench_gpu.py: no CUDA device here -- nothing measured (use --dry-run to "
                     "check the script on the CPU)")
        from dpsharp.torch import kernels

        if not kernels.cuda_built():
            sys.exit("bench_gpu.py: dpsharp was built without CUDA kernels; reinstall with "
                     "pip install . -Ccmake.define.DPSHARP_CUDA=ON")
        device = "cuda"
    lines = [f"# GPU benchmark ({'DRY RUN on CPU, tiny models: not a measurement' if args.dry_run else torch.cuda.get_device_name()})",
             "", f"command: python {' '.join(sys.argv)}",
             f"torch {torch.__version__}, python {platform.python_version()}, amp={args.amp}", "",
             ("| model | batch | non-private ex/s | dpsharp ex/s | opacus-ghost ex/s "
              "| dpsharp / non-private (target >= 0.9) | dpsharp / opacus-ghost (target >= 1.5) "
              "| peak GiB non-private / dpsharp / opacus-ghost "
              "| memory dpsharp / non-private (target <= 1.3) |"),
             "|---|---|---|---|---|---|---|---|---|"]
    steps, rounds = (1, 1) if args.dry_run else (args.steps, args.rounds)
    for name in args.models:
        mem = peak_memory(name, device, args.batch, amp, args.dry_run)
        print(f"  {name}: peak bytes {mem}", file=sys.stderr, flush=True)
        t, b = time_modes(name, device, steps, rounds, args.batch, amp, args.dry_run)
        thr = {m: b / s for m, s in t.items()}
        np_, dp, og = (thr.get(m, float("nan")) for m in MODES)
        gib = [mem.get(m, float("nan")) / 2**30 for m in MODES]
        lines.append(f"| {name} | {b} | {np_:.1f} | {dp:.1f} | {og:.1f} | {dp / np_:.2f} | "
                     f"{dp / og:.2f} | {gib[0]:.2f} / {gib[1]:.2f} / {gib[2]:.2f} | "
                     f"{gib[1] / gib[0]:.2f} |")
        print(lines[-1], flush=True)
    numel = 1 << 16 if args.dry_run else args.numel
    if device == "cuda":
        fused, copy = noise_bandwidth(device, numel, 20)
        lines += ["", (f"fused noise pass: {fused:.0f} GB/s, copy: {copy:.0f} GB/s, "
                       f"ratio {fused / copy:.2f} (target >= 0.70 of the copy roofline), N = {numel} float32")]
        print(lines[-1])
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    else:
        print(text)


if __name__ == "__main__":
    main()

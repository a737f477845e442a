"""DP training step time and peak memory: dpsharp's PerSampleClipper vs non-private training
vs Opacus 1.6.0, on the same data, in the same run.

Models (synthetic data; the step time does not depend on the values):
  mlp          MLP 784-512-512-10, batch 256
  cnn          MNIST CNN (Abadi et al. 2016 style: two conv + max-pool blocks, then dense;
               the 16/32-channel variant of the Opacus / Papernot et al. MNIST example),
               28x28 inputs, batch 256
  transformer  embedding 10k x 128 (+ position embedding), 2 pre-LN encoder layers (4 heads,
               FFN 512) built from nn.Linear / nn.LayerNorm, seq 64, batch 64, mean-pooled
               classifier

Modes: nonprivate (plain SGD step), dpsharp (clip every example, add noise, SGD step:
PerSampleClipper, release() after the backward pass; arm_release gives the same gradients by the
same kernels), opacus-hooks (GradSampleModule + DPOptimizer) and opacus-ghost (fast gradient /
ghost clipping); "opacus best" is the faster of the two on each model. `--retain-freed-memory`
runs every mode under dpsharp.torch.retain_freed_memory().

Timing: every mode runs in its own process (bench/_step_server.py; a user runs one mode per
process, and modes sharing one malloc heap move each other's page faults). Rounds interleave
the modes (the machine is shared): in each round every mode takes a turn of 1 + `--steps` steps,
the first step of the turn (which follows the other processes' turns) is dropped, and the
reported time is the median over rounds of the mean of the other `--steps` step times.
Memory: each (model, mode) runs in a fresh subprocess at 1 thread; peak memory is the peak
resident set size (VmHWM) minus the RSS after building the model, optimiser and batch,
i.e. what the training steps add (an RSS delta, not tracemalloc, which cannot see torch's
allocations).

Run:  python bench/bench_training.py --threads 1 2 --out bench/results/training_speed.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import warnings

import torch
from torch import nn
from torch.nn import functional as F


# --------------------------------------------------------------------------- models
class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 8, stride=2, padding=3)
        self.conv2 = nn.Conv2d(16, 32, 4, stride=2)
        self.fc1 = nn.Linear(32 * 4 * 4, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2, 1)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2, 1)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Block(nn.Module):
    """A pre-LN transformer layer from nn.Linear / nn.LayerNorm (also bench_gpu.py's GPT-2 layer,
    with ``causal=True``)."""

    def __init__(self, dim: int, heads: int, ffn: int, *, causal: bool = False) -> None:
        super().__init__()
        self.heads = heads
        self.causal = causal
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, ffn)
        self.fc2 = nn.Linear(ffn, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.reshape(shape).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(self, vocab: int = 10_000, dim: int = 128, layers: int = 2, seq: int = 64,
                 classes: int = 10) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.Sequential(*[Block(dim, 4, 4 * dim) for _ in range(layers)])
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        # contiguous: Opacus 1.6 ghost clipping fails on expanded (strided) index tensors
        pos = torch.arange(idx.shape[1]).unsqueeze(0).expand_as(idx).contiguous()
        h = self.blocks(self.tok(idx) + self.pos(pos))
        return self.head(self.ln(h).mean(dim=1))


def make(model_name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if model_name == "mlp":
        model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                              nn.Linear(512, 10))
        x = torch.randn(256, 784, generator=g)
        y = torch.randint(0, 10, (256,), generator=g)
    elif model_name == "cnn":
        model = CNN()
        x = torch.randn(256, 1, 28, 28, generator=g)
        y = torch.randint(0, 10, (256,), generator=g)
    elif model_name == "transformer":
        model = Transformer()
        x = torch.randint(0, 10_000, (64, 64), generator=g)
        y = torch.randint(0, 10, (64,), generator=g)
    else:
        raise ValueError(model_name)
    return model, x, y


# --------------------------------------------------------------------------- steps
SIGMA, C, LR = 1.0, 1.0, 0.05


def build_step(mode: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """A zero-argument function doing one training step in ``mode``."""
    batch = x.shape[0]
    if mode == "nonprivate":
        opt = torch.optim.SGD(model.parameters(), lr=LR)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        return step
    if mode == "dpsharp":
        from dpsharp.torch import NoiseGenerator, PerSampleClipper

        clipper = PerSampleClipper(model, max_grad_norm=C)
        noise = NoiseGenerator(0)
        opt = torch.optim.SGD(clipper.parameters, lr=LR)

        def dp_step() -> None:  # clipped sums accumulated in the backward, released by release()
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            clipper.release(noise_multiplier=SIGMA, expected_batch_size=batch, noise=noise)
            opt.step()
        return dp_step
    if mode == "opacus-hooks":
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        gsm = GradSampleModule(model)
        opt = DPOptimizer(torch.optim.SGD(gsm.parameters(), lr=LR), noise_multiplier=SIGMA,
                          max_grad_norm=C, expected_batch_size=batch)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(gsm(x), y).backward()
            opt.step()
        return step
    if mode == "opacus-ghost":
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

        gsm = GradSampleModuleFastGradientClipping(model, max_grad_norm=C,
                                                   use_ghost_clipping=True)
        opt = DPOptimizerFastGradientClipping(
            torch.optim.SGD(gsm.parameters(), lr=LR), noise_multiplier=SIGMA, max_grad_norm=C,
            expected_batch_size=batch)
        crit = DPLossFastGradientClipping(gsm, opt, nn.CrossEntropyLoss())

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            crit(gsm(x), y).backward()
            opt.step()
        return step
    raise ValueError(mode)


MODES = ["nonprivate", "dpsharp", "opacus-hooks", "opacus-ghost"]


def time_modes(model_name: str, threads: int, steps: int, rounds: int,
               retain: bool = False) -> dict[str, float]:
    """Median over rounds of each mode's mean step time (seconds). Every mode runs in its own
    process (bench/_step_server.py: modes sharing one heap move each other's page faults); a
    round gives each mode a turn of 1 + ``steps`` steps, and the first step of a turn (which
    follows the other processes' turns) is left out of the mean."""
    from _step_server import StepServer

    servers = [StepServer(model_name, mode, threads, retain_freed_memory=retain)
               for mode in MODES]
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    try:
        for _ in range(rounds):
            for server in servers:
                times = server.run(1 + steps)[1:]
                samples[server.mode].append(sum(times) / len(times))
    finally:
        for server in servers:
            server.close()
    return {m: statistics.median(v) for m, v in samples.items()}


def status_kib(field: str) -> int:
    """VmRSS (current) or VmHWM (peak) of this process in KiB. VmHWM belongs to the address
    space, so unlike ru_maxrss it does not inherit the parent's peak across fork + exec."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field}")


def memory_child(model_name: str, mode: str, steps: int, retain: bool) -> None:
    if retain:
        from dpsharp.torch import retain_freed_memory

        retain_freed_memory()
    torch.set_num_threads(1)
    model, x, y = make(model_name)
    step = build_step(mode, model, x, y)
    base = status_kib("VmRSS")
    for _ in range(steps):
        step()
    print(json.dumps({"delta_kib": status_kib("VmHWM") - base}))


def memory_modes(model_name: str, steps: int, retain: bool) -> dict[str, float]:
    out = {}
    for mode in MODES:
        res = subprocess.run(
            [sys.executable, __file__, "--memory-child", model_name, mode, "--steps", str(steps)]
            + (["--retain-freed-memory"] if retain else []),
            capture_output=True, text=True, check=True)
        out[mode] = json.loads(res.stdout.strip().splitlines()[-1])["delta_kib"] / 1024.0
    return out


def main() -> None:
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["mlp", "cnn", "transformer"])
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--memory-child", nargs=2, metavar=("MODEL", "MODE"))
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--memory-only", action="store_true")
    ap.add_argument("--out")
    ap.add_argument("--retain-freed-memory", action="store_true",
                    help="call dpsharp.torch.retain_freed_memory() first, in every mode's "
                         "process (glibc keeps freed memory instead of returning it)")
    args = ap.parse_args()
    if args.memory_child:
        memory_child(*args.memory_child, args.steps, args.retain_freed_memory)
        return
    retained = False
    if args.retain_freed_memory:
        from dpsharp.torch import retain_freed_memory

        retained = retain_freed_memory()
    lines = [
        "| model | threads | non-private ms | dpsharp ms | opacus-hooks ms | opacus-ghost ms | "
        "DP / non-private | opacus best / dpsharp |",
        "|---|---|---|---|---|---|---|---|",
    ]
    mem_lines = ["| model | non-private MiB | dpsharp MiB | opacus-hooks MiB | opacus-ghost MiB | "
                 "dpsharp / non-private |",
                 "|---|---|---|---|---|---|"]
    for model_name in args.models:
        for threads in [] if args.memory_only else args.threads:
            t = time_modes(model_name, threads, args.steps, args.rounds,
                           args.retain_freed_memory)
            best = min(t["opacus-hooks"], t["opacus-ghost"])
            row = (f"| {model_name} | {threads} | {t['nonprivate']*1e3:.1f} | "
                   f"{t['dpsharp']*1e3:.1f} | "
                   f"{t['opacus-hooks']*1e3:.1f} | {t['opacus-ghost']*1e3:.1f} | "
                   f"{t['dpsharp']/t['nonprivate']:.2f}x | "
                   f"{best/t['dpsharp']:.2f}x |")
            print(row, flush=True)
            lines.append(row)
        if not args.no_memory:
            m = memory_modes(model_name, max(2, args.steps), args.retain_freed_memory)
            row = (f"| {model_name} | {m['nonprivate']:.1f} | {m['dpsharp']:.1f} | "
                   f"{m['opacus-hooks']:.1f} | "
                   f"{m['opacus-ghost']:.1f} | {m['dpsharp']/max(m['nonprivate'], 1e-9):.2f}x |")
            print(row, flush=True)
            mem_lines.append(row)
    import opacus

    header = (
        "# DP training step time: dpsharp vs non-private vs Opacus\n\n"
        f"Command: `python {' '.join(sys.argv)}`\n\n"
        f"torch {torch.__version__}, opacus {opacus.__version__}; shared 2-core CPU (other "
        "jobs running: only ratios within one run mean anything). Step = zero_grad + forward + "
        "backward (+ clip/noise) + SGD step; one process per mode, modes in turns of 1 + "
        "`--steps` steps, the first step of each turn dropped; median over rounds of the mean "
        "of the other `--steps` steps; sigma = 1, C = 1. dpsharp: PerSampleClipper, release() after the backward "
        "pass."
        + (" Allocator: dpsharp.torch.retain_freed_memory() in every mode's process "
           f"(applied: {retained})." if args.retain_freed_memory else
           " Allocator: glibc defaults.")
        + "\n\n"
    )
    text = header + "\n".join(lines) + "\n\nPeak memory added by training steps (RSS delta, 1 thread):\n\n"
    text += "\n".join(mem_lines) + "\n"
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    print(text)


if __name__ == "__main__":
    main()

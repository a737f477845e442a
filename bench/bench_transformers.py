"""DP fine-tuning step time and peak memory of transformers: dpsharp's PerSampleClipper vs
non-private training vs Opacus 1.6.0, on the same data, in the same run.

Models (synthetic tokens; the step time does not depend on the values):
  gpt2          Hugging Face GPT-2 from a config: 4 layers, width 256, 4 heads, vocabulary
                1,000, sequence 128, batch 8, next-token loss; full fine-tuning
  gpt2-lora     the same with PEFT LoRA adapters (r = 8) on c_attn and c_proj, base frozen
  encoder       nn.TransformerEncoder classifier: embedding 1,000 x 256 + positions, 2 layers
                (4 heads, FFN 1024, batch_first), sequence 128, batch 8, mean-pooled; full
  encoder-lora  the same with PEFT LoRA (r = 8) on linear1 / linear2, base frozen

Modes: nonprivate (plain SGD step), dpsharp (PerSampleClipper, release() after the backward,
SGD step), opacus-hooks (GradSampleModule + DPOptimizer) and opacus-ghost (fast gradient
clipping), where Opacus can train the model (the encoder after Opacus' ModuleValidator.fix,
which swaps nn.MultiheadAttention for DPMultiheadAttention); a mode that fails to build or step
is reported as such, with its error.

Timing as bench/bench_training.py: every mode in its own process; rounds interleave the modes,
each taking a turn of 1 + `--steps` steps whose first step is dropped; the median over rounds of
the turn means. ``--clock cpu`` times each step by the process's CPU time (time.process_time)
instead of the wall clock: at 1 thread the work a step does, whatever else the machine runs
(time spent waiting for a core shared with other jobs is not counted); at more threads it also
counts the threads' spinning and is no measure of a step's latency. Memory: a fresh process
per (model, mode) at 1 thread; peak RSS (VmHWM) minus the RSS after building model, optimiser
and batch. The machine's load average before and after the run is printed with the results.

Run:  python bench/bench_transformers.py --threads 1 2 --out bench/results/transformers.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, SEQ, BATCH, WIDTH = 1000, 128, 8, 256
SIGMA, C, LR = 1.0, 1.0, 0.05


class EncoderClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.pos = nn.Embedding(SEQ, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, 4, 4 * WIDTH, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1]).expand(idx.shape[0], -1)
        return self.head(self.body(self.embed(idx) + self.pos(positions)).mean(1))


def _lora(model: nn.Module, targets: list[str], fan_in_fan_out: bool) -> nn.Module:
    import peft

    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=targets, lora_dropout=0.0,
                             fan_in_fan_out=fan_in_fan_out)
    return peft.get_peft_model(model, config)


def make(model_name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor, str]:
    """(model, input ids, targets, loss kind)."""
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    x = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    if model_name.startswith("gpt2"):
        import transformers

        config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=WIDTH,
                                         n_layer=4, n_head=4, resid_pdrop=0.0, embd_pdrop=0.0,
                                         attn_pdrop=0.0, use_cache=False, bos_token_id=0,
                                         eos_token_id=0)
        model: nn.Module = transformers.GPT2LMHeadModel(config)
        if model_name == "gpt2-lora":
            model = _lora(model, ["c_attn", "c_proj"], True)
        return model, x, x, "lm"
    if model_name.startswith("encoder"):
        model = EncoderClassifier()
        if model_name == "encoder-lora":
            model = _lora(model, ["linear1", "linear2"], False)
        return model, x, torch.randint(0, 10, (BATCH,), generator=g), "class"
    raise ValueError(model_name)


def _loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "lm":
        # per-example mean over positions, then the batch mean (Opacus' ghost loss wrapper
        # needs one loss per example; the mean of the batch is what every mode backpropagates)
        logits = model(input_ids=x).logits[:, :-1]
        return F.cross_entropy(logits.reshape(-1, VOCAB), y[:, 1:].reshape(-1))
    return F.cross_entropy(model(x), y)


def build_step(mode: str, model: nn.Module, x: torch.Tensor, y: torch.Tensor, kind: str):
    """A zero-argument function doing one training step in ``mode``."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if mode == "nonprivate":
        opt = torch.optim.SGD(trainable, lr=LR)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            _loss(model, x, y, kind).backward()
            opt.step()
        return step
    if mode == "dpsharp":
        from dpsharp.torch import NoiseGenerator, PerSampleClipper

        clipper = PerSampleClipper(model, max_grad_norm=C)
        noise = NoiseGenerator(0)
        opt = torch.optim.SGD(clipper.parameters, lr=LR)

        def dp_step() -> None:
            opt.zero_grad(set_to_none=True)
            _loss(model, x, y, kind).backward()
            clipper.release(noise_multiplier=SIGMA, expected_batch_size=BATCH, noise=noise)
            opt.step()
        return dp_step
    from opacus.validators import ModuleValidator

    model = ModuleValidator.fix(model)
    if mode == "opacus-hooks":
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        gsm = GradSampleModule(model)
        opt = DPOptimizer(torch.optim.SGD([p for p in gsm.parameters() if p.requires_grad],
                                          lr=LR), noise_multiplier=SIGMA, max_grad_norm=C,
                          expected_batch_size=BATCH)

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            _loss(gsm, x, y, kind).backward()
            opt.step()
        return step
    if mode == "opacus-ghost":
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

        gsm = GradSampleModuleFastGradientClipping(model, max_grad_norm=C,
                                                   use_ghost_clipping=True)
        opt = DPOptimizerFastGradientClipping(
            torch.optim.SGD([p for p in gsm.parameters() if p.requires_grad], lr=LR),
            noise_multiplier=SIGMA, max_grad_norm=C, expected_batch_size=BATCH)

        class PerExample(nn.Module):
            def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
                if kind == "lm":  # (B, T-1, V) and (B, T-1): one mean loss per example
                    return F.cross_entropy(logits.transpose(1, 2), target,
                                           reduction="none").mean(1)
                return F.cross_entropy(logits, target, reduction="none")

        criterion = DPLossFastGradientClipping(gsm, opt, PerExample(), loss_reduction="mean")

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            if kind == "lm":
                out = gsm(input_ids=x).logits[:, :-1]
                criterion(out, y[:, 1:]).backward()
            else:
                criterion(gsm(x), y).backward()
            opt.step()
        return step
    raise ValueError(mode)


MODES = ["nonprivate", "dpsharp", "opacus-hooks", "opacus-ghost"]


# --------------------------------------------------------------------------- processes
def serve(model_name: str, mode: str, threads: int, clock: str = "wall") -> None:
    """Child: build the step, warm up, then answer ``run K`` lines with K step times."""
    torch.set_num_threads(threads)
    now = time.process_time if clock == "cpu" else time.perf_counter
    try:
        step = build_step(mode, *make(model_name))
        for _ in range(2):
            step()
    except Exception as error:  # reported, not raised: Opacus cannot train every model
        print("failed " + json.dumps(f"{type(error).__name__}: {error}"[:200]), flush=True)
        return
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        times = []
        for _ in range(int(words[1])):
            t0 = now()
            step()
            times.append(now() - t0)
        print(json.dumps(times), flush=True)


class Server:
    def __init__(self, model_name: str, mode: str, threads: int, clock: str = "wall") -> None:
        self.mode = mode
        self.error: str | None = None
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve", model_name, mode, str(threads), "--clock",
             clock],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first = self._line()
        if first != "ready":
            self.error = json.loads(first[len("failed "):]) if first.startswith("failed ") \
                else f"exited: {first!r}"
            self.close()

    def _line(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def run(self, steps: int) -> list[float]:
        assert self.process.stdin is not None
        self.process.stdin.write(f"run {steps}\n")
        self.process.stdin.flush()
        return [float(t) for t in json.loads(self._line())]

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.write("quit\n")
            self.process.stdin.flush()
        self.process.wait()


def time_modes(model_name: str, threads: int, steps: int, rounds: int,
               modes: list[str], clock: str = "wall") -> dict[str, float | str]:
    servers = [Server(model_name, mode, threads, clock) for mode in modes]
    live = [s for s in servers if s.error is None]
    samples: dict[str, list[float]] = {s.mode: [] for s in live}
    try:
        for _ in range(rounds):
            for server in live:
                times = server.run(1 + steps)[1:]
                samples[server.mode].append(sum(times) / len(times))
    finally:
        for server in live:
            server.close()
    out: dict[str, float | str] = {s.mode: s.error for s in servers if s.error is not None}
    out.update({m: statistics.median(v) for m, v in samples.items()})
    return out


def status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field}")


def memory_child(model_name: str, mode: str, steps: int) -> None:
    torch.set_num_threads(1)
    try:
        step = build_step(mode, *make(model_name))
    except Exception as error:
        print(json.dumps({"error": f"{type(error).__name__}: {error}"[:200]}))
        return
    base = status_kib("VmRSS")
    try:
        for _ in range(steps):
            step()
    except Exception as error:
        print(json.dumps({"error": f"{type(error).__name__}: {error}"[:200]}))
        return
    print(json.dumps({"delta_kib": status_kib("VmHWM") - base}))


def memory_modes(model_name: str, steps: int, modes: list[str]) -> dict[str, float | str]:
    out: dict[str, float | str] = {}
    for mode in modes:
        res = subprocess.run([sys.executable, __file__, "--memory-child", model_name, mode,
                              "--steps", str(steps)], capture_output=True, text=True)
        lines = res.stdout.strip().splitlines()
        result = json.loads(lines[-1]) if lines else {"error": res.stderr[-200:]}
        out[mode] = (result["delta_kib"] / 1024.0 if "delta_kib" in result
                     else str(result["error"]))
    return out


def _ms(v: float | str) -> str:
    return f"{v * 1e3:.0f}" if isinstance(v, float) else "fails"


def main() -> None:
    warnings.filterwarnings("ignore")
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+",
                    default=["gpt2", "gpt2-lora", "encoder", "encoder-lora"])
    ap.add_argument("--modes", nargs="+", default=MODES)
    ap.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-memory", action="store_true")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="step time by the wall clock or by the process's CPU time")
    ap.add_argument("--serve", nargs=3, metavar=("MODEL", "MODE", "THREADS"))
    ap.add_argument("--memory-child", nargs=2, metavar=("MODEL", "MODE"))
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.serve:
        serve(args.serve[0], args.serve[1], int(args.serve[2]), args.clock)
        return
    if args.memory_child:
        memory_child(*args.memory_child, args.steps)
        return
    load_before = os.getloadavg()[0]
    lines = ["| model | threads | non-private ms | dpsharp ms | opacus-hooks ms | "
             "opacus-ghost ms | DP / non-private | opacus best / dpsharp |",
             "|---|---|---|---|---|---|---|---|"]
    mem_lines = ["| model | non-private MiB | dpsharp MiB | opacus-hooks MiB | opacus-ghost MiB |"
                 " dpsharp / non-private |", "|---|---|---|---|---|---|"]
    failures: dict[str, str] = {}
    for model_name in args.models:
        for threads in args.threads:
            t = time_modes(model_name, threads, args.steps, args.rounds, args.modes,
                           args.clock)
            for mode, v in t.items():
                if isinstance(v, str):
                    failures[f"{model_name} / {mode}"] = v
            get = {m: t.get(m, "not run") for m in MODES}
            opacus = [v for m, v in get.items() if m.startswith("opacus") and
                      isinstance(v, float)]
            dp, plain = get["dpsharp"], get["nonprivate"]
            ratio = f"{dp / plain:.2f}x" if isinstance(dp, float) and isinstance(plain, float) \
                else "-"
            best = (f"{min(opacus) / dp:.2f}x" if opacus and isinstance(dp, float)
                    else "opacus fails")
            row = (f"| {model_name} | {threads} | {_ms(plain)} | {_ms(dp)} | "
                   f"{_ms(get['opacus-hooks'])} | {_ms(get['opacus-ghost'])} | {ratio} | "
                   f"{best} |")
            print(row, flush=True)
            lines.append(row)
        if not args.no_memory:
            m = memory_modes(model_name, 2, args.modes)
            got = {k: m.get(k, "not run") for k in MODES}
            mib = {k: (f"{v:.0f}" if isinstance(v, float) else "fails") for k, v in got.items()}
            dp, plain = got["dpsharp"], got["nonprivate"]
            ratio = (f"{dp / max(plain, 1e-9):.2f}x" if isinstance(dp, float)
                     and isinstance(plain, float) else "-")
            row = (f"| {model_name} | {mib['nonprivate']} | {mib['dpsharp']} | "
                   f"{mib['opacus-hooks']} | {mib['opacus-ghost']} | {ratio} |")
            print(row, flush=True)
            mem_lines.append(row)
    import opacus
    import transformers

    text = (
        "# DP fine-tuning of transformers: dpsharp vs non-private vs Opacus\n\n"
        f"Command: `python {' '.join(sys.argv)}`\n\n"
        f"torch {torch.__version__}, transformers {transformers.__version__}, opacus "
        f"{opacus.__version__}; {os.cpu_count()} CPU cores, load average {load_before:.1f} "
        f"before the run and {os.getloadavg()[0]:.1f} after it (other jobs on the machine slow "
        "every mode: only ratios within one run mean anything). Step = zero_grad + forward + "
        "backward "
        "(+ clip/noise) + SGD step; one process per mode, modes in turns of 1 + `--steps` steps "
        "(the first dropped), median over rounds; sigma = 1, C = 1, batch 8, sequence 128; "
        + ("step times are the process's CPU time (time.process_time).\n\n"
           if args.clock == "cpu" else "step times by the wall clock.\n\n")
        + "\n".join(lines)
        + "\n\nPeak memory added by training steps (RSS delta, 1 thread):\n\n"
        + "\n".join(mem_lines) + "\n"
    )
    if failures:
        text += "\nModes that could not train a model (their first error):\n\n" + "\n".join(
            f"- {k}: {v}" for k, v in failures.items()) + "\n"
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    print(text)


if __name__ == "__main__":
    main()

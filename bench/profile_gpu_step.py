"""Where a DP training step spends its GPU time: phase times and a profiler table.

For each model of bench/bench_gpu.py and each forward precision asked for, one process builds
the non-private and the dpsharp step, then

1. times the phases with the device synchronised between them (medians of ``--steps`` steps):
   forward, backward (for dpsharp this includes the per-example norms and clipped sums, which
   run at the end of the backward pass), the noise release and the optimizer step;
2. profiles ``--profile-steps`` dpsharp steps with torch.profiler and prints the operators and
   dpsharp's own stages (each usage method and kernel entry point wrapped in a
   ``record_function`` label ``dp:<name>`` by this script, not by the library) sorted by their
   total device time.

    python bench/profile_gpu_step.py [--models gpt2s resnet18] [--amp none bf16]
                                     [--out profile.txt]
"""

from __future__ import annotations

import argparse
import functools
import inspect
import statistics
import sys
import time

import torch
import torch.nn.functional as F  # noqa: F401  (bench_gpu's models use it)

from bench_gpu import LR, SIGMA, C, make  # noqa: F401


def _label(name: str, fn):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with torch.profiler.record_function(f"dp:{name}"):
            return fn(*args, **kwargs)
    return wrapped


def label_dpsharp_stages() -> list[tuple[object, str, object]]:
    """Wrap every method of the usage classes and the kernel entry points in a profiler label;
    returns what to put back (:func:`restore`): the labels cost host time outside a profile."""
    from dpsharp.torch import kernels
    from dpsharp.torch.layers import usages

    saved: list[tuple[object, str, object]] = []

    def wrap(owner: object, attr: str, label: str) -> None:
        saved.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, _label(label, getattr(owner, attr)))

    for cls_name in ("LinearUsage", "ConvUsage", "EmbeddingUsage", "AffineUsage",
                     "PerExampleUsage", "TransposedLinearUsage", "BlockUsage"):
        cls = getattr(usages, cls_name, None)
        if cls is None:
            continue
        for attr, value in list(vars(cls).items()):
            if inspect.isfunction(value) and attr not in ("__init__", "params", "merge"):
                wrap(cls, attr, f"{cls_name}.{attr}")
    for name in ("per_example_sq_norms", "per_example_dots", "clip_accumulate_noise",
                 "release_noise", "linear_sequence_sq_norms", "weighted_rows_float32"):
        if hasattr(kernels, name):
            wrap(kernels, name, f"kernels.{name}")
    for name in ("weighted_sum", "conv_patches", "_blocked_product", "tied_sq_norm",
                 "_wide_bmm", "_device_weighted_sum", "_bfloat16_weighted_sum"):
        if hasattr(usages, name):
            wrap(usages, name, f"usages.{name}")
    return saved


def restore(saved: list[tuple[object, str, object]]) -> None:
    for owner, attr, value in reversed(saved):
        setattr(owner, attr, value)


DEVICE = "cuda"


# ------------------------------------------------------------------ candidate variants (A/B)
# Each variant replaces one stage of the library for the duration of one measurement, so that
# a candidate can be timed against the library's own stage in the same process before it is
# adopted. They compute the same quantities (float32 accumulation of exact products, float64
# weighted sums); tests/test_cuda_kernels.py holds the library to that standard.

def _weighted_sum_kernel(rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum_i weights[i] rows[i] by the fused CUDA clip kernel (float64 sums in example order,
    one thread per ten columns): the library's path on a GPU before the matrix product."""
    from dpsharp.torch import kernels

    rows = rows.contiguous()
    out = torch.empty(rows.shape[1:], dtype=rows.dtype, device=rows.device)
    return kernels.clip_accumulate_noise(out, per_example=rows,
                                         factors=weights.to(torch.float64).contiguous())


def _conv_per_example_grouped(self) -> torch.Tensor:
    """ConvUsage._weight_per_example by one grouped convolution weight gradient (groups = the
    batch): no patches. float32 inputs with TF32 off; half inputs widened to float32 (exact)
    with TF32 on, whose products of half-precision values are exact."""
    if self._per_example_weight is None:
        x, g = self.x, self.g
        b, out_channels, _ = g.shape
        kernel, stride, padding, dilation = self._geometry
        half = x.dtype in (torch.float16, torch.bfloat16)
        xw, gw = (x.float(), g.float()) if half else (x, g)
        xr = xw.reshape(1, b * x.shape[1], *x.shape[2:])
        gr = gw.reshape(1, b * out_channels, *self._out_grad_shape[2:])
        weight = torch.empty((b * out_channels, x.shape[1], *kernel), dtype=xw.dtype,
                             device=x.device)
        with torch.backends.cudnn.flags(enabled=True, benchmark=True, deterministic=False,
                                        allow_tf32=half):
            _, grad_weight, _ = torch.ops.aten.convolution_backward(
                gr, xr, weight, None, list(stride), list(padding), list(dilation), False,
                [0] * len(kernel), b, [False, True, False])
        self._per_example_weight = grad_weight.reshape(b, out_channels, self._row)
    return self._per_example_weight


VARIANTS = {
    "wsum-kernel": [("usages", "weighted_sum", _weighted_sum_kernel)],
    "conv-grouped": [("ConvUsage", "_weight_per_example", _conv_per_example_grouped)],
    # linear layers under bf16 autocast on the Gram path (float64 Grams, split-bf16 clipped
    # sums) instead of materialised bfloat16 per-example gradients
    "gram-half": [("usages", "_HALF_MATERIALISED_PER_STORED", 0)],
}
DEFAULT_VARIANTS = ["gram-half"]


class _Patched:
    def __init__(self, names: list[str]) -> None:
        from dpsharp.torch.layers import usages

        self.targets = []
        for name in names:
            for owner_name, attr, value in VARIANTS[name]:
                owner = usages if owner_name == "usages" else getattr(usages, owner_name)
                self.targets.append((owner, attr, value))
        self.saved: list = []

    def __enter__(self) -> None:
        for owner, attr, value in self.targets:
            self.saved.append((owner, attr, getattr(owner, attr)))
            setattr(owner, attr, value)

    def __exit__(self, *exc) -> None:
        for owner, attr, value in reversed(self.saved):
            setattr(owner, attr, value)


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def phases(mode: str, name: str, amp: torch.dtype | None, steps: int) -> dict[str, float]:
    """Median seconds of each phase of ``mode``'s step (device synchronised between phases)."""
    model, x, y, loss_fn = make(name, DEVICE, None, DEVICE == "cpu")
    if mode.startswith("dpsharp"):
        from dpsharp.torch import NoiseGenerator, PerSampleClipper

        clipper = PerSampleClipper(model, max_grad_norm=C)
        noise = NoiseGenerator(0)
        params = clipper.parameters
    else:
        clipper = noise = None
        params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=LR)
    samples: dict[str, list[float]] = {"forward": [], "backward": [], "release": [], "step": []}
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for i in range(steps + 3):
        opt.zero_grad(set_to_none=True)
        sync()
        t0 = time.perf_counter()
        with torch.autocast(DEVICE, dtype=amp, enabled=amp is not None):
            out = model(x)
        loss = loss_fn(out, y)
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        if clipper is not None:
            clipper.release(noise_multiplier=SIGMA, expected_batch_size=x.shape[0], noise=noise)
        sync()
        t3 = time.perf_counter()
        opt.step()
        sync()
        t4 = time.perf_counter()
        if i >= 3:
            for key, value in zip(samples, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
                samples[key].append(value)
    peak = torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else 0.0
    del model, x, y, opt, clipper
    _release_device_memory()
    PEAK_GIB[mode] = peak
    return {k: statistics.median(v) for k, v in samples.items()}


PEAK_GIB: dict[str, float] = {}  # the allocator's peak over each mode's steps in phases()


def _warm_dp_step(name: str, amp: torch.dtype | None):
    """A dpsharp training step of ``name`` (clipper, noise, AdamW), warmed up by three steps."""
    from dpsharp.torch import NoiseGenerator, PerSampleClipper

    model, x, y, loss_fn = make(name, DEVICE, None, DEVICE == "cpu")
    clipper = PerSampleClipper(model, max_grad_norm=C)
    noise = NoiseGenerator(0)
    opt = torch.optim.AdamW(clipper.parameters, lr=LR)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(DEVICE, dtype=amp, enabled=amp is not None):
            out = model(x)
        loss_fn(out, y).backward()
        clipper.release(noise_multiplier=SIGMA, expected_batch_size=x.shape[0], noise=noise)
        opt.step()

    for _ in range(3):
        step()
    sync()
    return step


def _release_device_memory() -> None:
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def profile_table(name: str, amp: torch.dtype | None, steps: int, rows: int) -> str:
    """torch.profiler's operator table over ``steps`` dpsharp steps, by total device time."""
    step = _warm_dp_step(name, amp)
    acts = [torch.profiler.ProfilerActivity.CPU]
    if DEVICE == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        sync()
    order = "cuda_time_total" if DEVICE == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=order, row_limit=rows, max_name_column_width=60)
    del step
    _release_device_memory()
    return table


def python_profile(name: str, amp: torch.dtype | None, steps: int, rows: int) -> str:
    """cProfile of ``steps`` dpsharp steps (after warm-up): the host-side (Python) time, which
    bounds a step whose device work is shorter than its launches."""
    import cProfile
    import io
    import pstats

    step = _warm_dp_step(name, amp)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for _ in range(steps):
        step()
    sync()
    prof.disable()
    wall = (time.perf_counter() - t0) / steps
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(rows)
    buf.write("### the same profile by cumulative time (what each call and its callees took)\n")
    stats.sort_stats("cumulative").print_stats(rows)
    del step
    _release_device_memory()
    return (f"### host-side profile, {steps} steps, {1e3 * wall:.1f} ms per step under "
            f"cProfile\n" + buf.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gpt2s", "resnet18"])
    ap.add_argument("--amp", nargs="+", choices=["none", "bf16"], default=["none", "bf16"])
    ap.add_argument("--variants", nargs="*", default=DEFAULT_VARIANTS,
                    help="candidate stages to time against the library's (see VARIANTS)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--profile-steps", type=int, default=2)
    ap.add_argument("--rows", type=int, default=40)
    ap.add_argument("--python-profile", action="store_true",
                    help="also a cProfile of the dpsharp step (host-side time)")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny models on the CPU: only checks that the script runs")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    global DEVICE
    if args.dry_run:
        DEVICE = "cpu"
    elif not torch.cuda.is_available():
        sys.exit("profile_gpu_step.py: no CUDA device (use --dry-run to check the script)")
    device_name = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU dry run"
    lines = [f"# {device_name}, torch {torch.__version__}"]
    summary = []
    for name in args.models:
        for amp_name in args.amp:
            amp = {"none": None, "bf16": torch.bfloat16}[amp_name]
            ph = {}
            for mode in ["nonprivate", "dpsharp"] + [f"dpsharp+{v}" for v in args.variants]:
                with _Patched(mode.split("+")[1:]):
                    try:
                        ph[mode] = phases(mode, name, amp, args.steps)
                    except Exception as exc:  # noqa: BLE001 - report and go on
                        print(f"  {name}/{amp_name}/{mode}: {type(exc).__name__}: {exc}",
                              flush=True)
            head = f"## {name} amp={amp_name}: phase medians (ms)"
            lines.append(head)
            for m, p in ph.items():
                row = f"  {m:11s} " + "  ".join(f"{k} {1e3 * v:8.2f}" for k, v in p.items())
                row += f"  total {1e3 * sum(p.values()):8.2f}  peak {PEAK_GIB.get(m, 0.0):6.2f} GiB"
                lines.append(row)
            summary.append(f"{name}/{amp_name}: " + " | ".join(
                f"{m} " + " ".join(f"{k[0]}{1e3 * v:.1f}" for k, v in p.items())
                + f" ={1e3 * sum(p.values()):.1f}" for m, p in ph.items()))
            print("\n".join(lines[-1 - len(ph):]), flush=True)
            labels = label_dpsharp_stages()
            try:
                lines.append(profile_table(name, amp, args.profile_steps, args.rows))
            finally:
                restore(labels)
            if args.python_profile:
                lines.append(python_profile(name, amp, args.profile_steps, args.rows))
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)
    print("\n".join(summary))


if __name__ == "__main__":
    main()

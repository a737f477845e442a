"""Cost of the PrivacyBudget check against one DP training step on the digits example.

The check (PrivacyEngine._check_budget, run before every release) is timed in the same process
as full training steps (forward, backward with per-example clipping, release, optimizer step),
and the ratio check / median step is printed (target: < 1%), for two models:

* ``digits example``: examples/train_digits.py's model and data (softmax regression, full-batch
  DP-GD: expected batch = the 1437 training images, q = 1);
* ``demo CNN``: the digits CNN of ``dpsharp demo`` (dpsharp.demo.build_model) at batch 256.

    python bench/budget_check_overhead.py
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import torch
from dpsharp.demo import build_model, load_digits_split
from dpsharp.torch import PoissonDataLoader, PrivacyBudget, PrivacyEngine
from torch import nn
from torch.utils.data import Dataset

ROOT = Path(__file__).resolve().parents[1]


def load_digits_example():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("train_digits", ROOT / "examples" / "train_digits.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(model: nn.Module, train: Dataset, expected_batch_size: int, noise_multiplier: float,
            min_steps: int = 20) -> dict[str, float | int | bool]:
    """Median time of a full DP step and mean time of the budget check, in one process."""
    engine = PrivacyEngine(accountant="pld")
    model, optimizer, loader = engine.make_private(
        model, torch.optim.SGD(model.parameters(), lr=1.0),
        PoissonDataLoader(train, expected_batch_size=expected_batch_size, seed=0),
        noise_multiplier=noise_multiplier, max_grad_norm=1.0, delta=1e-5,
        budget=PrivacyBudget(3.0, 1e-5), seed=0,
    )
    step_times: list[float] = []
    while len(step_times) < min_steps:
        for x, y in loader:
            start = time.perf_counter()
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            step_times.append(time.perf_counter() - start)
            if len(step_times) >= min_steps:
                break
    repeats = 2000
    start = time.perf_counter()
    for _ in range(repeats):
        engine._check_budget(optimizer)
    check = (time.perf_counter() - start) / repeats
    step = sorted(step_times)[len(step_times) // 2]
    return {"median_step_s": step, "check_s": check, "ratio": check / step, "steps": len(step_times),
            "first_check_includes_search": True}


if __name__ == "__main__":
    torch.set_num_threads(1)
    digits = load_digits_example()
    train, _, _ = digits.load()
    # sigma 7.6222: what the example's engine calibrates for 30 full-batch steps at eps 3
    print(json.dumps({"model": "digits example (linear, q = 1)",
                      **measure(digits.build_model(), train, len(train), 7.6222)}))
    train, _, _ = load_digits_split(0)
    print(json.dumps({"model": "demo CNN (batch 256)", **measure(build_model(), train, 256, 3.5)}))

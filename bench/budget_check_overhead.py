"""Cost of the PrivacyBudget check against one DP training step on the digits example.

The check (PrivacyEngine._check_budget, run before every release) is timed in the same process
as full training steps (forward, backward with per-example clipping, release, optimizer step)
of the digits CNN of ``dpsharp demo`` (dpsharp.demo.build_model) at batch 256, and the ratio
is printed (issue 7: < 1%).

    python bench/budget_check_overhead.py
"""

from __future__ import annotations

import json
import time

import torch
from dpsharp.demo import build_model, load_digits_split
from dpsharp.torch import PoissonDataLoader, PrivacyBudget, PrivacyEngine
from torch import nn

train, _, _ = load_digits_split(0)
model = build_model()
engine = PrivacyEngine(accountant="pld")
model, optimizer, loader = engine.make_private(
    model, torch.optim.SGD(model.parameters(), lr=1.0), PoissonDataLoader(train, expected_batch_size=256, seed=0),
    noise_multiplier=3.5, max_grad_norm=1.0, delta=1e-5, budget=PrivacyBudget(3.0, 1e-5), seed=0,
)
step_times = []
for x, y in loader:
    start = time.perf_counter()
    optimizer.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    step_times.append(time.perf_counter() - start)
repeats = 2000
start = time.perf_counter()
for _ in range(repeats):
    engine._check_budget(optimizer)
check = (time.perf_counter() - start) / repeats
step = sorted(step_times)[len(step_times) // 2]
print(json.dumps({"median_step_s": step, "check_s": check, "ratio": check / step,
                  "steps": len(step_times), "first_check_includes_search": True}))

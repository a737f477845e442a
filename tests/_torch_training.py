"""A DP training loop for the engine tests: cross-entropy steps through a PrivacyEngine's
optimizer and loader (an empty Poisson batch releases pure noise: step() alone)."""

from __future__ import annotations

from typing import Any


def train_steps(model: Any, optimizer: Any, loader: Any, steps: int | None, *,
                limit: int = 2000) -> int:
    """Take ``steps`` optimizer steps (None: until a budget stops the run) over as many passes
    of ``loader`` as needed (BudgetExhausted propagates); AssertionError if ``limit`` steps go
    by first. Returns the steps taken."""
    from torch import nn

    taken = 0
    while taken < limit:
        for x, y in loader:
            optimizer.zero_grad()
            if len(y):
                nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
            taken += 1
            if taken == steps:
                return taken
    raise AssertionError(f"neither {steps} steps nor a budget's stop within {limit} steps")

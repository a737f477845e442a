"""A small, transparent DP-SGD loop for the schedule experiments (digits, breast cancer).

Model: multinomial logistic regression (softmax over W [x, 1]), whose per-example gradient has
the closed form g_i = (p_i - e_{y_i}) [x_i, 1]^T with norm ||p_i - e_{y_i}|| ||[x_i, 1]||, so
per-example clipping costs one matrix product per batch (a vmap over a torch model was ~50 ms a
step on the shared 2-core machine: too slow for 30+ runs). The update is that of Abadi et al.
2016: theta -= lr (sum_i clip_C(g_i) + N(0, (sigma C)^2 I)) / B, with B the batch size
(reshuffling) or the expected batch size q n (Poisson).

Privacy is accounted outside this file, by composing the run's events into dpsharp accountants
(dpsharp.torch.schedules), so every epsilon / rho reported is an accountant's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Split:
    x_train: np.ndarray
    y_train: np.ndarray
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int


def load(name: str, *, seed: int = 0, val_fraction: float = 0.15, test_fraction: float = 0.2) -> Split:
    """digits: features x/16 (the public pixel range); breast_cancer: standardised with the
    training split's mean and std (a non-private preprocessing step, as is usual in the
    papers' experiments). A bias feature 1 is appended."""
    from sklearn.datasets import load_breast_cancer, load_digits

    data = load_digits() if name == "digits" else load_breast_cancer()
    x = data.data.astype(np.float64)
    y = data.target.astype(np.int64)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    n_test = int(round(test_fraction * len(y)))
    n_val = int(round(val_fraction * len(y)))
    test, val, train = order[:n_test], order[n_test : n_test + n_val], order[n_test + n_val :]
    if name == "digits":
        x = x / 16.0
    else:
        mean, std = x[train].mean(0), x[train].std(0) + 1e-12
        x = (x - mean) / std
    x = np.hstack([x, np.ones((len(x), 1))])
    return Split(x[train], y[train], x[val], y[val], x[test], y[test], int(y.max()) + 1)


class DPSGD:
    """Noisy SGD with per-example clipping on a softmax regression model."""

    def __init__(self, features: int, classes: int, *, clip: float, seed: int) -> None:
        self.w = np.zeros((features, classes))
        self.clip = clip
        self.noise = np.random.default_rng(10_000 + seed)

    def _probs(self, x: np.ndarray) -> np.ndarray:
        z = x @ self.w
        z -= z.max(1, keepdims=True)
        p = np.exp(z)
        return p / p.sum(1, keepdims=True)

    def step(self, x: np.ndarray, y: np.ndarray, *, sigma: float, lr: float, normaliser: float) -> None:
        total = np.zeros_like(self.w)
        if len(y):
            residual = self._probs(x)
            residual[np.arange(len(y)), y] -= 1.0
            norms = np.linalg.norm(residual, axis=1) * np.linalg.norm(x, axis=1)
            scale = np.minimum(1.0, self.clip / np.maximum(norms, 1e-300))
            total = x.T @ (residual * scale[:, None])
        noisy = total + self.noise.normal(0.0, sigma * self.clip, size=self.w.shape)
        self.w -= lr * noisy / normaliser

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        return float(((x @ self.w).argmax(1) == y).mean())

    def shuffled_epoch(self, split: Split, *, batch: int, sigma: float, lr: float, rng: np.random.Generator) -> None:
        """One epoch of random reshuffling: disjoint batches of ``batch`` (the last may be short)."""
        order = rng.permutation(len(split.y_train))
        for start in range(0, len(order), batch):
            idx = order[start : start + batch]
            self.step(split.x_train[idx], split.y_train[idx], sigma=sigma, lr=lr, normaliser=float(batch))

    def poisson_step(self, split: Split, *, q: float, sigma: float, lr: float, rng: np.random.Generator) -> None:
        """One Poisson-sampled step; the normaliser is the expected batch size q n."""
        n = len(split.y_train)
        idx = np.flatnonzero(rng.random(n) < q)
        self.step(split.x_train[idx], split.y_train[idx], sigma=sigma, lr=lr, normaliser=q * n)


def summary(values: list[float]) -> tuple[float, float, float, float]:
    """mean, sample std, min, max."""
    a = np.asarray(values, dtype=float)
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0, float(a.min()), float(a.max())

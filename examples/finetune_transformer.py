"""Differentially private fine-tuning of a small transformer on generated token sequences.

The data (generated, no download): sequences of 16 tokens drawn uniformly from a vocabulary of
24; an example is labelled 1 when more of its tokens come from the lower half of the vocabulary
(0-11) than from the upper half, else 0 (ties are dropped), so the label depends on the whole
sequence. 2,000 training and 500 test sequences.

The model: token + position embeddings, a 2-layer nn.TransformerEncoder (width 32, 4 heads,
feed-forward 64, batch_first, pre-norm), mean-pooled, and a linear head. The "pretrained" body
is first fitted non-privately on 1,000 sequences of a *public* task (does the lower half of the
vocabulary occur in the first position: no private data involved), then the whole model is
fine-tuned with DP-SGD on the private task: Poisson sampling, per-example clipping of every
parameter (the attention's projections through the clipper's linear maps, Vaswani et al. 2017
attention; Abadi et al. 2016 DP-SGD), Gaussian noise calibrated so that --epochs epochs cost at
most --target-epsilon at --delta, and a PrivacyBudget that stops training before any step would
exceed it. A tqdm progress bar shows each epoch; the last lines print the privacy statement and
one JSON object with test_accuracy and epsilon.

    python examples/finetune_transformer.py --target-epsilon 3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from decimal import ROUND_CEILING, Decimal

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

VOCAB, LENGTH, WIDTH = 24, 16, 32


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(LENGTH, WIDTH)
        layer = nn.TransformerEncoderLayer(WIDTH, 4, 2 * WIDTH, dropout=0.0, batch_first=True,
                                           norm_first=True)
        self.body = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, 2)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device).expand(idx.shape[0], -1)
        h = self.body(self.tokens(idx) + self.positions(positions))
        return self.head(self.norm(h).mean(dim=1))


def generate(n: int, generator: torch.Generator, *, public: bool = False
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """n sequences and their labels (module docstring)."""
    idx = torch.randint(0, VOCAB, (2 * n, LENGTH), generator=generator)
    low = (idx < VOCAB // 2).sum(dim=1)
    if public:
        return idx[:n], (idx[:n, 0] < VOCAB // 2).long()
    keep = low * 2 != LENGTH
    idx, low = idx[keep][:n], low[keep][:n]
    return idx, (low * 2 > LENGTH).long()


def rounded_up(epsilon: float, quantum: str = "0.0001") -> str:
    """A certified epsilon printed rounded up (round-to-nearest could print less than the
    bound), on its exact decimal expansion."""
    return str(Decimal(epsilon).quantize(Decimal(quantum), rounding=ROUND_CEILING))


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        result = float((model(x).argmax(1) == y).float().mean())
    model.train()
    return result


def pretrain(model: nn.Module, generator: torch.Generator, steps: int) -> None:
    """Non-private fitting on the public task (no private data)."""
    x, y = generate(1000, generator, public=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(steps):
        batch = torch.randint(0, len(x), (64,), generator=generator)
        optimizer.zero_grad()
        F.cross_entropy(model(x[batch]), y[batch]).backward()
        optimizer.step()


def main(argv: Sequence[str] | None = None) -> dict[str, object]:
    from tqdm import tqdm

    from dpsharp.torch import BudgetExhausted, PoissonDataLoader, PrivacyBudget, PrivacyEngine

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--target-epsilon", type=float, default=3.0,
                        help="privacy budget epsilon: sigma is calibrated to it and training "
                        "stops before exceeding it")
    parser.add_argument("--delta", type=float, default=1e-5, help="privacy budget delta")
    parser.add_argument("--epochs", type=int, default=10, help="passes over the private data")
    parser.add_argument("--batch-size", type=int, default=100,
                        help="expected (Poisson) batch size")
    parser.add_argument("--max-grad-norm", type=float, default=1.0,
                        help="per-example clipping norm C")
    parser.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate")
    parser.add_argument("--noise-multiplier", type=float, default=None,
                        help="noise std / clipping norm; use this sigma instead of calibrating "
                        "to --target-epsilon (the budget still stops training there)")
    parser.add_argument("--accountant", default="rdp", help="accountant name")
    parser.add_argument("--pretrain-steps", type=int, default=150,
                        help="non-private steps on the public task before fine-tuning")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the data, the initialisation, the sampler and the noise")
    parser.add_argument("--quick", action="store_true",
                        help="a short run (at most 2 epochs, 30 pretraining steps)")
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs = min(args.epochs, 2)
        args.pretrain_steps = min(args.pretrain_steps, 30)

    start = time.perf_counter()
    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    x_train, y_train = generate(2000, generator)
    x_test, y_test = generate(500, generator)
    model = Classifier()
    pretrain(model, generator, args.pretrain_steps)
    before = accuracy(model, x_test, y_test)

    engine = PrivacyEngine(accountant=args.accountant)
    budget = PrivacyBudget(args.target_epsilon, args.delta)
    model, optimizer, loader = engine.make_private(
        model, torch.optim.Adam(model.parameters(), lr=args.lr),
        PoissonDataLoader(TensorDataset(x_train, y_train), expected_batch_size=args.batch_size,
                          seed=args.seed),
        target_epsilon=None if args.noise_multiplier is not None else args.target_epsilon,
        noise_multiplier=args.noise_multiplier, delta=args.delta, epochs=args.epochs,
        max_grad_norm=args.max_grad_norm, budget=budget, seed=args.seed)
    print(f"private task: n_train={len(x_train)} q={loader.sample_rate:.4f} "
          f"sigma={optimizer.noise_multiplier:.4f} ({args.accountant}); test accuracy after "
          f"public pretraining {before:.4f}")
    stopped = False
    test_accuracy = before
    for epoch in range(1, args.epochs + 1):
        losses = []
        bar = tqdm(loader, desc=f"epoch {epoch}", leave=False, file=sys.stderr)
        try:
            for x, y in bar:
                optimizer.zero_grad()
                if len(y):  # an empty Poisson batch: step() releases pure noise
                    loss = F.cross_entropy(model(x), y)
                    loss.backward()
                    losses.append(loss.item())
                optimizer.step()
                bar.set_postfix(epsilon=rounded_up(engine.epsilon(args.delta), "0.001"))
        except BudgetExhausted:
            stopped = True
        finally:
            bar.close()
        test_accuracy = accuracy(model, x_test, y_test)
        mean_loss = sum(losses) / len(losses) if losses else float("nan")
        print(f"epoch {epoch:3d}  loss {mean_loss:.4f}  test accuracy {test_accuracy:.4f}  "
              f"epsilon {rounded_up(engine.epsilon(args.delta))}")
        if stopped:
            break
    report = engine.report(args.delta)
    epsilon = rounded_up(report.epsilon)
    print(f"Privacy statement: the fine-tuning satisfies ({epsilon}, {report.delta:g})"
          f"-differential privacy{' under ' + report.guarantee if report.guarantee else ''}, "
          f"{'certified' if report.certified else 'approximate'} ({report.accountant} "
          f"accountant, {report.sampling} sampling, {report.steps} steps, noise multiplier "
          f"{optimizer.noise_multiplier:.4f}, clipping norm {args.max_grad_norm}); the public "
          "pretraining data is not protected and needs no protection.")
    result: dict[str, object] = {
        "dataset": "generated_sequences",
        "test_accuracy": test_accuracy,
        "accuracy_before_finetuning": before,
        "epsilon": report.epsilon,
        "delta": args.delta,
        "certified": report.certified,
        "accountant": args.accountant,
        "noise_multiplier": optimizer.noise_multiplier,
        "sample_rate": loader.sample_rate,
        "epochs": epoch,
        "steps": engine.steps,
        "max_grad_norm": args.max_grad_norm,
        "stopped_by_budget": stopped,
        "seconds": round(time.perf_counter() - start, 2),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()

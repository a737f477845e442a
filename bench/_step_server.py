"""One training mode per process, stepped in turns by the benchmark (bench_training.py,
bench_training_interleaved.py).

Why a process per mode: timed in one process, the modes share one malloc heap. glibc returns
freed memory at the top of the heap to the system and faults it back in later, and where the
top of the heap lies depends on what every mode allocated: Opacus' per-sample mode churns about
1 GB per MLP step, and even plain and DP steps alternated in one process move each other's page
faults. Measured at 2 threads with glibc's defaults (minor faults per step): the MLP's DP step
took ~230 and its plain step ~13 when alternated in one process, 100-280 each in processes of
their own; the transformer's ~8,900 and ~900 in one process, ~6,300 and ~5,300 apart. A user
runs one mode per process, so each mode gets its own.

Why turns: the machine is shared and its speed drifts within minutes, so the modes still
alternate (a turn of a few steps each, round-robin), and every mode sees the same conditions.
The first step of each turn is timed but marked: it starts on caches the other process filled
and next to that process's OpenMP workers, which keep spinning for a while after its last
operator; the callers keep the steps after it.

Protocol (text lines): the child prints ``ready`` once built and warmed up; for each line
``run K`` on its stdin it runs K steps and prints a JSON list of their times in seconds; ``quit``
(or end of input) ends it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent


class StepServer:
    """A child process that builds ``bench_training.build_step(mode, *make(model_name))`` on
    ``threads`` threads and times its steps on request."""

    def __init__(self, model_name: str, mode: str, threads: int, *,
                 import_from: Path | None = None, retain_freed_memory: bool = False,
                 warmup: int = 2) -> None:
        command = [sys.executable, str(Path(__file__).resolve()), model_name, mode, str(threads),
                   str(warmup)]
        if import_from is not None:
            command += ["--import-from", str(import_from)]
        if retain_freed_memory:
            command.append("--retain-freed-memory")
        self.mode = mode
        self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True)
        first = self._read_line()
        if first != "ready":
            raise RuntimeError(f"step server for {mode} did not start: {first!r}")

    def _read_line(self) -> str:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            code = self._process.wait()
            raise RuntimeError(f"step server for {self.mode} exited with code {code}")
        return line.strip()

    def run(self, steps: int) -> list[float]:
        """Times of ``steps`` consecutive steps, in seconds (the first follows the other
        processes' turns)."""
        assert self._process.stdin is not None
        self._process.stdin.write(f"run {steps}\n")
        self._process.stdin.flush()
        return [float(t) for t in json.loads(self._read_line())]

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.write("quit\n")
            self._process.stdin.flush()
            self._process.wait()


def _serve(argv: list[str]) -> None:
    import argparse
    import warnings

    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("mode")
    ap.add_argument("threads", type=int)
    ap.add_argument("warmup", type=int)
    ap.add_argument("--import-from", type=Path)
    ap.add_argument("--retain-freed-memory", action="store_true")
    args = ap.parse_args(argv)
    if args.import_from is not None:
        # Drop the import hooks of an editable install so that DIR/python wins.
        sys.meta_path[:] = [f for f in sys.meta_path
                            if "editable" not in type(f).__module__.lower()]
        sys.path.insert(0, str(args.import_from / "python"))
    warnings.filterwarnings("ignore")
    import torch

    if args.retain_freed_memory:
        from dpsharp.torch import retain_freed_memory

        retain_freed_memory()
    sys.path.insert(0, str(_HERE))
    from bench_training import build_step, make

    torch.set_num_threads(args.threads)
    step = build_step(args.mode, *make(args.model))
    for _ in range(args.warmup):
        step()
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        times = []
        for _ in range(int(words[1])):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        print(json.dumps(times), flush=True)


if __name__ == "__main__":
    _serve(sys.argv[1:])

"""dpsharp's default PLD answers against dp-accounting's default PLD answers, on every query
that dp-accounting's own test files make of the PLD accountant.

Usage (from the repository root)::

    python tests/peers/pld_defaults.py            # print the comparison table
    python tests/peers/pld_defaults.py --write    # and write bench/results/pld_peer_defaults.md

The test files (:data:`FILES`: every file of dp-accounting 0.6.0 that constructs its
``PLDAccountant``) run from the installed package, unmodified, with dpsharp's adapters in the
peer's place (:mod:`peer_swap`, through :func:`run_peer_suites.run_suite`). This module is also
the pytest plugin loaded next to it (``-p pld_defaults``): it wraps the adapter's
``PLDAccountant.get_epsilon`` and ``get_delta`` so that every query a test makes is answered by
dpsharp as before (the test sees dpsharp's value) and is recorded together with dp-accounting's
own answer to the same query: the peer's ``PLDAccountant`` (captured before the swap), with its
default ``value_discretization_interval`` (1e-4), composing the adapter's ``ledger`` (the same
events as dp-accounting's ``DpEventBuilder`` holds them) under the same neighbouring relation.
dpsharp is *looser* on a query where its answer (a certified upper bound) is above the peer's.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RESULTS = ROOT / "bench" / "results"

#: dp-accounting 0.6.0's test files that construct its PLDAccountant (relative to the package)
FILES = ["pld/pld_privacy_accountant_test.py", "gaussian_mechanism_test.py"]
#: the environment variable naming the file the plugin appends its records to
RECORD = "DPSHARP_PLD_DEFAULTS_RECORD"

# The peer's class, captured when pytest imports this plugin (before peer_swap's
# pytest_configure puts the adapter in its place).
try:
    from dp_accounting.pld import pld_privacy_accountant as _peer_module

    _PEER_CLASS: Any = _peer_module.PLDAccountant
except ImportError:  # not installed: the plugin records nothing
    _PEER_CLASS = None

_TEST = [""]
#: (ledger repr, relation name) -> the peer accountant that composed that ledger, or its error
_PEERS: dict[tuple[str, str], Any] = {}


def _peer_answer(adapter: Any, query: str, argument: float) -> tuple[float | None, str, float]:
    """(dp-accounting's default answer to ``query``(``argument``) on the adapter's ledger, its
    error message or "", the seconds the peer took)."""
    start = time.perf_counter()
    ledger = adapter.ledger
    relation = adapter.neighboring_relation
    key = (repr(ledger), relation.name)
    peer = _PEERS.get(key)
    if peer is None:
        try:
            peer = _PEER_CLASS(relation)
            peer.compose(ledger)
        except Exception as exc:  # noqa: BLE001 - recorded, the test goes on
            peer = exc
        _PEERS[key] = peer
    if isinstance(peer, Exception):
        return None, f"{type(peer).__name__}: {peer}", time.perf_counter() - start
    try:
        value = float(getattr(peer, query)(argument))
    except Exception as exc:  # noqa: BLE001
        return None, f"{type(exc).__name__}: {exc}", time.perf_counter() - start
    return value, "", time.perf_counter() - start


def _recording(method: Any, query: str) -> Any:
    @functools.wraps(method)
    def wrapper(self: Any, argument: Any) -> Any:
        start = time.perf_counter()
        value = method(self, argument)  # dpsharp's answer; an exception propagates unrecorded
        seconds = time.perf_counter() - start
        try:
            number = float(argument)
        except (TypeError, ValueError):
            return value
        if type(self).__name__ != "PLDAccountant" or math.isnan(number):
            return value
        peer, error, peer_seconds = _peer_answer(self, query, number)
        record = {
            "test": _TEST[0],
            "relation": self.neighboring_relation.name,
            "ledger": repr(self.ledger),
            "query": query,
            "argument": number,
            "dpsharp": float(value),
            "peer": peer,
            "peer_error": error,
            "seconds": {"dpsharp": seconds, "peer": peer_seconds},
        }
        with open(os.environ[RECORD], "a", encoding="utf-8") as stream:
            stream.write(json.dumps(record) + "\n")
        return value

    return wrapper


def pytest_configure(config: Any) -> None:
    if RECORD not in os.environ or _PEER_CLASS is None:
        return
    from dpsharp.compat import dp_accounting as adapter

    for query in ("get_epsilon", "get_delta"):
        cls = adapter.PLDAccountant if query in vars(adapter.PLDAccountant) else (
            adapter.PrivacyAccountant)
        setattr(cls, query, _recording(getattr(cls, query), query))


def pytest_runtest_setup(item: Any) -> None:
    # the file's name and the test's id within it (the files lie outside pytest's rootdir)
    _TEST[0] = Path(str(item.path)).name + "::" + item.nodeid.split("::", 1)[-1]


#: dp-accounting test -> why dpsharp's certified answer stays above dp-accounting's there
CAUSES = {
    name: (
        "delta = 1e-6 at epsilon about 17: dp-accounting's answer is within about 1e-8 of the "
        "exact epsilon (dpsharp's discretised curves on grids down to h = 1.5e-5 bracket it), "
        "and the certified upper bound adds to delta the FFT's proven round-off bound "
        f"({noise}) and the truncation budget's mass ({tail}), {shift} in epsilon; a finer grid "
        "does not help (the round-off bound grows with the spectrum's width)"
    )
    for name, noise, tail, shift in (
        ("test_mixture_of_gaussians_basic", "3.2e-13", "5.1e-13", "6.6e-7"),
        ("test_truncated_subsampled_gaussian_basic", "4.4e-13", "1.3e-13", "5.7e-7"),
    )
}


def looser(row: dict[str, Any]) -> bool:
    """Whether dpsharp's answer is above the peer's (both epsilon and delta are upper bounds:
    the smaller is the tighter)."""
    peer = row["peer"]
    return peer is not None and row["dpsharp"] > peer


def collect(files: list[str] | None = None) -> list[dict[str, Any]]:
    """Run ``files`` (default :data:`FILES`) of dp-accounting's tests on the adapters and return
    one record per PLD query (see the module docstring)."""
    sys.path.insert(0, str(HERE))
    import run_peer_suites

    with tempfile.TemporaryDirectory() as work:
        record = Path(work) / "queries.jsonl"
        record.touch()
        previous = os.environ.get(RECORD)
        os.environ[RECORD] = str(record)
        try:
            run_peer_suites.run_suite("dp_accounting", "adapter", False,
                                      extra=["-p", "pld_defaults"], only=files or FILES)
        finally:
            if previous is None:
                os.environ.pop(RECORD)
            else:
                os.environ[RECORD] = previous
        return [json.loads(line) for line in record.read_text().splitlines()]


def settings(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The distinct settings (relation, ledger, query, argument) of ``rows``, first test kept."""
    seen: dict[tuple[str, str, str, float], dict[str, Any]] = {}
    for row in rows:
        seen.setdefault((row["relation"], row["ledger"], row["query"], row["argument"]), row)
    return list(seen.values())


def markdown(rows: list[dict[str, Any]]) -> str:
    distinct = settings(rows)
    worse = [row for row in distinct if looser(row)]
    lines = [
        "# dpsharp's default PLD answers against dp-accounting's default",
        "",
        "Generated by `python tests/peers/pld_defaults.py --write`: every get_epsilon /",
        "get_delta query that dp-accounting 0.6.0's own test files "
        f"({', '.join(FILES)}) make of its",
        "PLDAccountant, answered by dpsharp's adapter at its default precision and by",
        "dp-accounting's PLDAccountant at its default value_discretization_interval (1e-4) on",
        "the same composed events. Relative difference: (dpsharp - peer) / peer (> 0: dpsharp",
        "looser).",
        "",
        f"{len(distinct)} distinct settings ({len(rows)} queries); dpsharp looser on "
        f"{len(worse)}.",
        "",
        "| test | relation | query | argument | dpsharp | dp-accounting | relative | events | "
        "cause |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in sorted(distinct, key=lambda r: (not looser(r), r["test"])):
        peer = row["peer"]
        if peer is None:
            relative, shown = "", "error: " + row["peer_error"][:80]
        else:
            shown = repr(peer)
            if peer == row["dpsharp"]:
                relative = "0"
            elif peer == 0.0 or math.isinf(peer):
                relative = "dpsharp larger" if row["dpsharp"] > peer else "dpsharp smaller"
            else:
                relative = f"{(row['dpsharp'] - peer) / peer:.2e}"
        name = row["test"].split("::")[-1]
        events = row["ledger"].replace("|", "\\|")
        if len(events) > 160:
            events = events[:157] + "..."
        lines.append(
            f"| `{name}` | {row['relation']} | {row['query']} | {row['argument']!r} | "
            f"{row['dpsharp']!r} | {shown} | {relative} | {events} | "
            f"{CAUSES.get(name, '') if looser(row) else ''} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true",
                        help="write bench/results/pld_peer_defaults.md")
    args = parser.parse_args(argv)
    text = markdown(collect())
    print(text)
    if args.write:
        (RESULTS / "pld_peer_defaults.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

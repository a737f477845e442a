"""Run the peers' own test suites against dpsharp's adapters and record every outcome.

Usage (from the repository root)::

    python tests/peers/run_peer_suites.py            # accountant test files, peer and adapter
    DPSHARP_PEER_FULL=1 python tests/peers/run_peer_suites.py   # also the slower files
    python tests/peers/run_peer_suites.py --write    # and rewrite bench/results/peer_suites.md
                                                     # and bench/results/peer_suites.json

Each suite's test files are run from the installed peer package (never copied), in a
subprocess whose working directory is a temporary folder, twice: once unchanged (the peer's
own baseline) and once with :mod:`peer_swap` substituting dpsharp's adapters for the peer's
accountant classes. prv-accountant's tests are not installed with it; its source distribution
is fetched with ``pip download`` when pip can reach an index (reported otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RESULTS = ROOT / "bench" / "results"

#: suite -> (files always run, files run only with DPSHARP_PEER_FULL=1), relative to the
#: installed package's directory
SUITES: dict[str, tuple[list[str], list[str]]] = {
    "dp_accounting": (
        [
            "pld/pld_privacy_accountant_test.py",
            "rdp/rdp_privacy_accountant_test.py",
            "dp_event_builder_test.py",
            "mechanism_calibration_test.py",
        ],
        ["dp_event_test.py", "privacy_accountant_test.py", "pld/accountant_test.py"],
    ),
    "opacus": (
        [],
        # about 5 minutes on two cores (a hypothesis search calibrates sigma 100 times)
        ["tests/accountants_test.py", "tests/accounting_noise_multiplier_test.py"],
    ),
    # prv-accountant 0.2.0's tests folder, from its source (:func:`prv_sources`); relative to it
    "prv_accountant": (["."], []),
}

#: suite -> the folder its files are relative to, where it is not the installed package's
SOURCE_DIRS: dict[str, Path] = {}

PRV_VERSION = "0.2.0"
PRV_REPOSITORY = "https://github.com/microsoft/prv_accountant"


def package_dir(suite: str) -> Path:
    if suite in SOURCE_DIRS:
        return SOURCE_DIRS[suite]
    module = __import__(suite)
    return Path(module.__file__).resolve().parent


def prv_sources(work: Path) -> tuple[Path | None, str]:
    """prv-accountant 0.2.0's ``tests`` folder under ``work`` and how it was found, or None and
    why not. Tried in turn: its sdist (``pip download --no-binary :all:``; the 0.2.0 sdist
    ships no tests), a git repository of it named by ``DPSHARP_PRV_ACCOUNTANT_GIT`` (tag
    v0.2.0, read with ``git archive``), and a shallow ``git clone`` of the tag."""
    notes = []
    sdist = work / "sdist"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "download", f"prv-accountant=={PRV_VERSION}",
         "--no-binary", ":all:", "--no-deps", "-d", str(sdist), "-q"],
        capture_output=True, text=True, timeout=300, check=False,
    )
    archives = sorted(sdist.glob("*.tar.gz")) if sdist.exists() else []
    if done.returncode == 0 and archives:
        subprocess.run(["tar", "-xzf", str(archives[0]), "-C", str(sdist)], check=True)
        found = sorted(sdist.glob("*/tests"))
        if found:
            return found[0], "its sdist (pip download)"
        notes.append("the sdist (pip download) ships no tests")
    else:
        tail = (done.stderr or done.stdout).strip().splitlines()
        reason = tail[-1] if tail else f"rc {done.returncode}"
        notes.append("pip cannot fetch the sdist: " + reason)
    target = work / "git"
    target.mkdir()
    local = os.environ.get("DPSHARP_PRV_ACCOUNTANT_GIT", "")
    if local:
        archive = subprocess.run(["git", "-C", local, "archive", f"v{PRV_VERSION}", "tests"],
                                 capture_output=True, check=False)
        if archive.returncode == 0:
            subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
            return target / "tests", f"git archive v{PRV_VERSION} of DPSHARP_PRV_ACCOUNTANT_GIT"
        notes.append(f"DPSHARP_PRV_ACCOUNTANT_GIT={local} has no tag v{PRV_VERSION}")
    clone = subprocess.run(
        ["git", "clone", "-q", "--depth", "1", "--branch", f"v{PRV_VERSION}", PRV_REPOSITORY,
         str(target / "clone")],
        capture_output=True, text=True, timeout=300, check=False,
    )
    if clone.returncode == 0:
        return target / "clone" / "tests", f"git clone of {PRV_REPOSITORY} v{PRV_VERSION}"
    tail = clone.stderr.strip().splitlines()
    notes.append("git clone failed: " + (tail[-1] if tail else f"rc {clone.returncode}"))
    return None, "; ".join(notes)


def run_suite(suite: str, mode: str, full: bool, extra: list[str] | None = None,
              only: list[str] | None = None) -> list[dict]:
    """Outcomes of ``suite``'s test files (or of the files ``only``) under ``mode`` ("peer" or
    "adapter")."""
    always, slow = SUITES[suite]
    base = package_dir(suite)
    files = [str(base / name) for name in only or always + (slow if full else [])]
    with tempfile.TemporaryDirectory() as work:
        record = Path(work) / "record.jsonl"
        env = dict(os.environ)
        env.update({
            "DPSHARP_PEER_MODE": mode,
            "DPSHARP_PEER_SUITE": suite,
            "DPSHARP_PEER_RECORD": str(record),
            "PYTHONPATH": os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]),
        })
        command = [sys.executable, "-m", "pytest", "-q", "-p", "peer_swap", "-p",
                   "no:cacheprovider", "--rootdir", work, "-c", os.devnull, *files,
                   *(extra or [])]
        subprocess.run(command, cwd=work, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
        if not record.exists():
            raise RuntimeError(f"{suite} ({mode}): pytest recorded nothing: {command}")
        rows = [json.loads(line) for line in record.read_text().splitlines()]
    for row in rows:  # the file relative to the peer's package, then the test's name
        name = os.path.relpath(row.pop("file"), base.parent)
        row["nodeid"] = name + "::" + row["nodeid"].split("::", 1)[-1]
    return rows


def summary(rows: list[dict]) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "skipped": 0, "exercised": 0, "exercised_passed": 0}
    for row in rows:
        counts[row["outcome"]] = counts.get(row["outcome"], 0) + 1
        if row["exercised"]:
            counts["exercised"] += 1
            counts["exercised_passed"] += row["outcome"] == "passed"
    return counts


def markdown(results: dict[str, Any], causes: dict[str, str]) -> str:
    lines = [
        "# The peers' own test suites against dpsharp's adapters",
        "",
        "Generated by `python tests/peers/run_peer_suites.py --write` (add DPSHARP_PEER_FULL=1",
        "for the slower files). Each peer test file runs from the installed package, unmodified,",
        "once as shipped (peer) and once with dpsharp's adapter classes substituted for the",
        "peer's accountant classes (adapter). *Exercised*: a dpsharp adapter was constructed or",
        "called during the test.",
        "",
        "dpsharp's default answers against dp-accounting's PLD at its default discretization",
        "interval 1e-4, on every PLD query of dp-accounting's test files:",
        "bench/results/pld_peer_defaults.md (`python tests/peers/pld_defaults.py --write`).",
        "",
        f"prv-accountant {PRV_VERSION}'s tests (its `tests` folder, run against the installed "
        f"package): from {results['prv_sdist']}. Its tests are not in its sdist; set "
        "DPSHARP_PRV_ACCOUNTANT_GIT to a clone of its repository where GitHub is unreachable.",
        "",
        *[f"* {suite}: {', '.join(data.get('files', []))}"
          for suite, data in results["suites"].items()],
        "",
        "| suite | peer: pass / fail / skip | adapter: pass / fail / skip | exercised "
        "(of which pass) | seconds (peer, adapter) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for suite, data in results["suites"].items():
        p, a = summary(data["peer"]), summary(data["adapter"])
        lines.append(
            f"| {suite} | {p['passed']} / {p['failed']} / {p['skipped']} | {a['passed']} / "
            f"{a['failed']} / {a['skipped']} | {a['exercised']} ({a['exercised_passed']}) | "
            f"{data['seconds']['peer']:.0f}, {data['seconds']['adapter']:.0f} |"
        )
    for suite, data in results["suites"].items():
        peer = {row["nodeid"]: row["outcome"] for row in data["peer"]}
        failures = [row for row in data["adapter"] if row["outcome"] == "failed"]
        lines += ["", f"## {suite}: adapter failures ({len(failures)})", ""]
        if not failures:
            lines.append("None.")
            continue
        lines += ["| test | on the peer | exercised | cause | message |",
                  "| --- | --- | --- | --- | --- |"]
        for row in failures:
            cause = next((text for key, text in causes.items() if key in row["nodeid"]), "")
            message = row["message"].replace("|", "\\|")
            lines.append(f"| `{row['nodeid']}` | {peer.get(row['nodeid'], '?')} | "
                         f"{'yes' if row['exercised'] else 'no'} | {cause} | {message} |")
    return "\n".join(lines) + "\n"



#: prv-accountant's tests (their ids start with ``tests/``) whose failures have a known cause
PRV_CAUSES: dict[str, str] = {
    "test_dpsgd.py::TestFindNoiseMultiplier::test_robustness": (
        "`pytest.warns(None)` is a TypeError in pytest >= 8: fails on the peer as well, before "
        "reaching the adapter (not exercised)"
    ),
}
_PRIVATE = "reads dp-accounting's private state (`_rdp`, `_orders`) or internals"

#: known causes of adapter failures, matched (first match wins) as substrings of the test id
CAUSES: dict[str, str] = {
    **PRV_CAUSES,
    "repeat_and_select_": (
        "K ~ Poisson: the test requires the RDP to be at least Theorem 6's expression of "
        "Papernot and Steinke 2022 (an upper bound, not a lower one); dpsharp's PoissonTuning "
        "bound keeps the K = 0 term and is below it (derivation and brute-force checks in "
        "dpsharp.tuning_events), intended difference"
    ),
    "zcdp": "ZCDpEvent: compares dp-accounting's private RDP arrays",
    "compute_rdp_poisson_sampled_gaussian": (
        "pins dp-accounting's RDP at order 1.5 (6.7058e-4); the exact divergence is 6.50071e-4 "
        "(30-digit integral, tests/test_compat_dp_accounting.py::"
        "test_fractional_order_rdp_is_exact_where_dp_accounting_overestimates), which dpsharp "
        "reports: intended difference"
    ),
    "multi_gaussian": "Poisson sampling with q = 1 compared on dp-accounting's private arrays",
    "test_compute_rdp_": _PRIVATE,
    "test_rdp_composition": _PRIVATE,
    "log_a_frac": _PRIVATE + " (a warning of its series evaluation)",
    "AccountingTest::test_rdp_accountant": (
        "exact value to 7 places: dpsharp's certified RDP epsilon differs in the 4th digit "
        "(7.32988 vs Opacus' 7.32911: larger, never smaller)"
    ),
    "test_accountant_load_state_dict": (
        "exact value to 7 places (the RDP epsilon above, after a checkpoint round trip)"
    ),
    "test_prv_accountant": (
        "exact value to 7 places: dpsharp's certified PLD upper bound is 6.7677, Opacus' PRV "
        "6.7774, and prv-accountant's own lower bound is below dpsharp's (tests/"
        "test_compat_opacus.py::test_opacus_prv_test_setting_is_certified_and_tighter): "
        "intended difference, tighter"
    ),
    "test_get_noise_multiplier_prv": (
        "exact calibrated sigma to 4 places on 'prv': Opacus' own search on dpsharp's tight "
        "accountant, whose certified epsilon is below PRV's, stops at a smaller sigma (the "
        "same search gives Opacus' sigma bit for bit on rdp and gdp, tests/"
        "test_compat_opacus.py::test_get_noise_multiplier_is_opacus_sigma_where_the_numbers_"
        "agree): intended difference"
    ),
    "test_get_noise_multiplier_": (
        "exact calibrated sigma to 4-7 places: dpsharp's accountants give slightly different "
        "epsilons, so the binary search stops at a different sigma"
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite bench/results files")
    parser.add_argument("--suite", choices=sorted(SUITES), action="append")
    parser.add_argument("--render", action="store_true",
                        help="only rewrite peer_suites.md from peer_suites.json")
    args = parser.parse_args(argv)
    if args.render:
        results = json.loads((RESULTS / "peer_suites.json").read_text())
        (RESULTS / "peer_suites.md").write_text(markdown(results, CAUSES))
        return 0
    full = os.environ.get("DPSHARP_PEER_FULL", "") not in ("", "0")
    results: dict[str, Any] = {"full": full, "prv_sdist": "", "suites": {}}
    previous: dict[str, Any] = {"suites": {}}
    if (RESULTS / "peer_suites.json").exists():
        previous = json.loads((RESULTS / "peer_suites.json").read_text())
    if args.suite:  # keep the other suites' rows
        results["suites"] = previous["suites"]
        results["prv_sdist"] = previous.get("prv_sdist", "")
    with tempfile.TemporaryDirectory() as sources:
        for suite in args.suite or sorted(SUITES):
            if not (SUITES[suite][0] or full):
                continue
            if suite == "prv_accountant":
                found, how = prv_sources(Path(sources))
                results["prv_sdist"] = how if found else "not run: " + how
                if found is None:
                    # keep the rows of the last run that could fetch the tests, and say so
                    kept = previous["suites"].get(suite)
                    if kept is None:
                        results["suites"].pop(suite, None)
                    else:
                        results["suites"][suite] = kept
                        results["prv_sdist"] += (
                            "; its rows below are from the last run that fetched them ("
                            + previous.get("prv_sdist", "").split("; its rows below")[0] + ")")
                    continue
                SOURCE_DIRS[suite] = found
            always, slow = SUITES[suite]
            data: dict[str, Any] = {"seconds": {}, "files": always + (slow if full else [])}
            for mode in ("peer", "adapter"):
                start = time.perf_counter()
                data[mode] = run_suite(suite, mode, full)
                data["seconds"][mode] = time.perf_counter() - start
            results["suites"][suite] = data
    text = markdown(results, CAUSES)
    print(text)
    if args.write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "peer_suites.md").write_text(text)
        (RESULTS / "peer_suites.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The repository speaks for itself: its text names no internal labels or files it does not
hold, and the paths its READMEs mention exist.

Fast (no import of dpsharp): reads the files ``git ls-files`` lists. Skipped outside a git
checkout (e.g. an installed sdist)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Built from pieces so that this file does not match its own pattern.
_FORBIDDEN = re.compile(
    "|".join(
        [
            "seeds" + "/",
            r"\b" + "issue" + r" [0-9]+",
            r"\b" + "[Ii]ssue" + r"s? #?[0-9]+",
            r"\b" + "REFERENCE" + r"\.md",
            r"\b" + "TORCH_CONTRACT" + r"\.md",
            r"\b" + "DESIGN" + r"\.md",
            r"\b" + "RELIABILITY" + r"\.md",
        ]
    )
)

# Data and binary files: not prose.
_SKIP_SUFFIXES = {
    ".png", ".jpg", ".jpeg", ".gif", ".pdf", ".svg", ".ico",
    ".json", ".npy", ".npz", ".pt", ".pkl", ".gz", ".zip", ".tar", ".so", ".bin",
}

# The READMEs whose repository paths (bench/..., python/..., tests/..., examples/..., cpp/...)
# must exist.
_README_FILES = ["README.md", "bench/results/README.md"]
_PATH_IN_TEXT = re.compile(r"(?<![\w./-])((?:bench|python|tests|examples|cpp)/[A-Za-z0-9_./-]*)")


def _tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.decode("utf-8", "surrogateescape")
    return [f for f in out.split("\0") if f]


def _text_lines(path: Path) -> list[str] | None:
    try:
        data = path.read_bytes()
    except OSError:  # listed but absent from the work tree (e.g. deleted, not yet staged)
        return None
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", "replace").splitlines()


def test_no_internal_labels_in_tracked_text() -> None:
    hits = []
    for name in _tracked_files():
        if Path(name).suffix.lower() in _SKIP_SUFFIXES:
            continue
        lines = _text_lines(ROOT / name)
        if lines is None:
            continue
        for number, line in enumerate(lines, 1):
            if _FORBIDDEN.search(line):
                hits.append(f"{name}:{number}: {line.strip()[:120]}")
    assert not hits, "internal labels or missing files named in:\n" + "\n".join(hits)


def test_paths_named_in_readmes_exist() -> None:
    tracked = set(_tracked_files())
    directories = {str(parent) for f in tracked for parent in Path(f).parents}
    missing = []
    for readme in _README_FILES:
        path = ROOT / readme
        if not path.exists():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in _PATH_IN_TEXT.finditer(line):
                ref = match.group(1).rstrip(".,;:)").rstrip("/")
                if "*" in ref or not ref:
                    continue
                if ref in tracked or ref in directories or (ROOT / ref).exists():
                    continue
                missing.append(f"{readme}:{number}: {ref}")
    assert not missing, "paths named in the READMEs that do not exist:\n" + "\n".join(missing)

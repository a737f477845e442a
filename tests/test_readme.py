"""Every ```python block of README.md runs, and every `dpsharp ...` command in its ```bash
blocks exits 0 (commands run in a temporary directory, so files they write land there)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README.read_text()) if lang == language]


def dpsharp_commands() -> list[str]:
    commands = []
    for body in blocks("bash"):
        for line in body.splitlines():
            line = line.split("#", 1)[0].strip()
            for part in line.split("&&"):
                part = part.strip()
                if part.startswith("dpsharp "):
                    commands.append(part)
    return commands


def test_readme_has_the_three_uses() -> None:
    text = README.read_text()
    assert "dpsharp.compat.opacus.PLDAccountant()" in text
    assert any(cmd.startswith("dpsharp epsilon ") for cmd in dpsharp_commands())
    assert any(cmd.startswith("dpsharp calibrate ") for cmd in dpsharp_commands())
    assert any("calibrate.noise_multiplier" in block for block in blocks("python"))


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_python_block_runs(index: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                           capsys: pytest.CaptureFixture[str]) -> None:
    source = blocks("python")[index]
    for peer in ("opacus", "dp_accounting", "prv_accountant"):
        if re.search(rf"^import {peer}|^from {peer}", source, re.MULTILINE):
            pytest.importorskip(peer)
    monkeypatch.chdir(tmp_path)
    with warnings.catch_warnings():
        # Opacus' notice that its secure RNG is off (the README example does not need it).
        warnings.filterwarnings("ignore", message="Secure RNG turned off", category=UserWarning)
        exec(compile(source, f"README.md python block {index}", "exec"), {"__name__": "__readme__"})  # noqa: S102
    assert capsys.readouterr().out.strip(), "every README snippet prints something"


# `dpsharp demo` runs with the slow tests: tests/test_demo.py runs the same demo in the default run.
@pytest.mark.parametrize("command", [
    pytest.param(command, marks=pytest.mark.slow) if command.startswith("dpsharp demo") else command
    for command in dpsharp_commands()
])
def test_dpsharp_command_runs(command: str, tmp_path: Path) -> None:
    argv = shlex.split(command)[1:]
    if argv[:1] == ["demo"]:  # the full demo is the main job; here a one-epoch run (tests/test_demo.py)
        pytest.importorskip("torch")
        argv += ["--epochs", "1", "--no-progress", "--output", "demo-out"]
    if "--plot" in argv or "--output" in argv or "curve" in argv[:1]:
        pytest.importorskip("matplotlib")
    result = subprocess.run([sys.executable, "-m", "dpsharp", *argv], check=False, cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    for flag in ("--plot", "--output"):
        if flag in argv:
            written = tmp_path / argv[argv.index(flag) + 1]
            assert written.stat().st_size > 1000

"""The README's results section is not stale: it is exactly what ``python bench/readme_tables.py``
writes from bench/results/, and every dpsharp number in its precision table is what the
accountants give now (recomputed here: milliseconds per row). The timing tables depend on the
machine and are not recomputed; they are checked to come from the current benchmark command
and its current output format."""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest

import dpsharp
from dpsharp.bench import precision, speed

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


@pytest.fixture(scope="module")
def tables() -> ModuleType:
    spec = importlib.util.spec_from_file_location("readme_tables",
                                                  ROOT / "bench" / "readme_tables.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def precision_rows(readme: str) -> dict[str, dict[str, str]]:
    """setting -> column -> cell text of the README's precision table."""
    lines = readme.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| setting (delta = 1e-5) |"))
    columns = [c.strip() for c in lines[start].strip("|").split("|")][1:]
    rows: dict[str, dict[str, str]] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(columns, cells[1:]))
    return rows


@functools.lru_cache(maxsize=None)
def epsilon_now(name: str, q: float, sigma: float, steps: int, delta: float) -> tuple[float, bool]:
    """(epsilon, certified) of accountant ``name`` for ``steps`` Poisson-sampled Gaussians."""
    event = dpsharp.PoissonSampled(dpsharp.Gaussian(sigma), q)
    guarantee = dpsharp.accountant(name).compose(event, steps).guarantee(delta)
    return float(guarantee.epsilon), bool(guarantee.certified)


def stale_cells(readme: str) -> list[str]:
    """The dpsharp cells of the README's precision table that differ from the accountants' answer
    now, at the printed precision, for the grid ``dpsharp bench precision`` runs."""
    rows = precision_rows(readme)
    stale = []
    assert set(rows) == {setting.name for setting in precision.DEFAULT_GRID}
    for s in precision.DEFAULT_GRID:
        for column, cell in rows[s.name].items():
            if not column.startswith("dpsharp."):
                continue
            epsilon, certified = epsilon_now(column.split(".", 1)[1], s.q, s.sigma, s.steps,
                                             s.delta)
            expected = f"{epsilon:.3f}" + ("" if certified else " (approx.)")
            if cell != expected:
                stale.append(f"{s.name} / {column}: README {cell}, code {expected}")
    return stale


def test_readme_results_section_is_what_the_generator_writes(tables: ModuleType) -> None:
    text = README.read_text()
    section = text[text.index(tables.BEGIN):text.index(tables.END) + len(tables.END)]
    assert section == tables.section(), "run: python bench/readme_tables.py"


def test_readme_precision_table_is_what_the_accountants_give_now() -> None:
    stale = stale_cells(README.read_text())
    assert not stale, ("stale README precision cells (rerun dpsharp bench precision --output "
                       "bench/results/precision and python bench/readme_tables.py): "
                       + "; ".join(stale))


def test_a_stale_precision_cell_is_caught() -> None:
    """The check itself: the q = 0.1, sigma = 2, T = 1000 row once showed a number the code no
    longer gave; changing any dpsharp cell by one printed digit is reported."""
    text = README.read_text()
    row = next(line for line in text.splitlines()
               if line.startswith("| hard q=0.1 sigma=2 T=1000 |"))
    cells = row.split("|")
    value = float(cells[2])
    tampered_row = "|".join(cells[:2] + [f" {value + 0.002:.3f} "] + cells[3:])
    stale = stale_cells(text.replace(row, tampered_row))
    assert len(stale) == 1 and "hard q=0.1 sigma=2 T=1000 / dpsharp.pld" in stale[0]


def test_results_json_holds_the_readme_numbers(tables: ModuleType) -> None:
    """bench/results/precision/results.json (what the section is generated from) covers the
    default grid and holds, for dpsharp, the numbers the accountants give now."""
    data = json.loads((ROOT / "bench" / "results" / "precision" / "results.json").read_text())
    assert [s["name"] for s in data["settings"]] == [s.name for s in precision.DEFAULT_GRID]
    for row in data["rows"]:
        if row["library"] != "dpsharp" or row["accountant"] not in tables.PRECISION_COLUMNS:
            continue
        epsilon, _ = epsilon_now(row["accountant"].split(".", 1)[1], row["q"], row["sigma"],
                                 row["steps"], row["delta"])
        assert f"{row['epsilon']:.3f}" == f"{epsilon:.3f}", row["setting"]


def test_timing_tables_come_from_the_current_commands(tables: ModuleType) -> None:
    """Not recomputed (machine-dependent), but made by today's command and format: the speed
    table's command line is the one that wrote speed.json, speed.json has the keys and the
    contender names run_speed writes now, and the training table is bench_training.py's."""
    text = README.read_text()
    results = json.loads((ROOT / "bench" / "results" / "speed" / "speed.json").read_text())
    assert set(results) == {"q", "delta", "quick", "repeats", "budget_seconds", "sweeps"}
    expected_budget = speed.QUICK_BUDGET_SECONDS if results["quick"] else speed.FULL_BUDGET_SECONDS
    assert results["budget_seconds"] == expected_budget
    command = tables.speed_command()
    assert f"`{command}`" in text
    assert command.startswith("dpsharp bench speed ")
    assert ("--quick" in command) == results["quick"]
    names = set(speed._contenders(use_peers=True))
    for sweep in results["sweeps"].values():
        assert set(sweep) == {"x", "records", "ratio_to_dpsharp_pld"}
        assert set(sweep["records"]) <= {"dpsharp.pld", "dpsharp.rdp", "dp_accounting.rdp",
                                         "dp_accounting.pld(interval=0.001)", "prv_accountant",
                                         "opacus.rdp", "opacus.prv"}
        assert set(sweep["records"]) >= {n for n in names if n.startswith("dpsharp.")}
    training = (ROOT / "bench" / "results" / "training_speed.md").read_text()
    assert re.search(r"\| model \| threads", training)
    assert tables.training_table() in text

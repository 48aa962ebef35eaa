"""The import rules, checked by the suite as CI's lint step checks them: the import-linter
contracts in pyproject.toml (app -> storage -> core; core imports no Qt and no SQL; storage no
Qt; the window's views and models no torch, SQL or storage; app/gui's folders in layers; no
cycle between sibling packages) must all be kept, and the modules of core/, storage/ and app/
form a DAG, which no contract can say (core's top-level folders import each other both ways,
so acyclic_siblings cannot cover core as a whole). import-linter's graph (grimp) holds the
imports inside functions too: a function-level import only hides a cycle until it runs."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("specscope.core", "specscope.storage", "specscope.app")


def test_every_import_contract_is_kept():
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    run = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command as c; sys.exit(c())",
            "--no-cache",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert f"Contracts: {len(contracts)} kept, 0 broken." in run.stdout


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None when the graph is a DAG."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_modules_form_a_dag():
    imports = grimp.build_graph(*PACKAGES)
    graph = {m: set(imports.find_modules_directly_imported_by(m)) for m in imports.modules}
    assert len(graph) > 100
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) is None

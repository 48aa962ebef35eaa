"""No function in core/, storage/ or app/ over 80 lines, unless its signature (the `def` line or,
as ruff format wraps it, a line before the body) carries a `# long: <reason>` comment (the architecture issue's rule,
kept by a test, not by memory)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 80


def long_functions(path: Path) -> list[str]:
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    out = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            signature = lines[node.lineno - 1 : node.body[0].lineno - 1] or [lines[node.lineno - 1]]
            if length > LIMIT and not any("# long:" in line for line in signature):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return out


def test_no_function_is_over_80_lines_without_a_reason():
    found = [
        f for pkg in ("core", "storage", "app") for p in sorted((ROOT / pkg).rglob("*.py")) for f in long_functions(p)
    ]
    assert found == []


def test_the_rule_notices_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "m.py").write_text(f"def long():\n{body}\n\ndef excused():  # long: a table\n{body}\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        assert [f.split()[1] for f in long_functions(tmp_path / "m.py")] == ["long"]
    finally:
        ROOT = saved

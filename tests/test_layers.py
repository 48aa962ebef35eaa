"""The layers point down only: app -> storage -> core. core imports no Qt, no SQL and no
higher layer; storage imports no Qt and not the app."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FORBIDDEN = {
    "core": ("PySide6", "pyqtgraph", "sqlalchemy", "specscope.storage", "specscope.app"),
    "storage": ("PySide6", "pyqtgraph", "specscope.app"),
}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level >= 2:
            names.add("..")  # reaches out of its own package
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_imports_point_down(layer):
    offenders = []
    for path in sorted((ROOT / layer).rglob("*.py")):
        for name in imported_modules(path):
            if name == ".." or any(name == f or name.startswith(f + ".") for f in FORBIDDEN[layer]):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert offenders == []


def test_the_checker_itself_notices_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from specscope.storage import TraceStore\nimport PySide6.QtWidgets\n")
    assert {"specscope.storage", "PySide6.QtWidgets"} <= imported_modules(bad)

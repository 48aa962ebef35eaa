"""Architecture: views take models; no torch, SQL or storage inside widget modules."""

from __future__ import annotations

import ast
from pathlib import Path

import specscope.app.gui as gui

VIEW_MODULES = ("timeline", "inspector", "tree", "plots", "findings", "runpanel", "navigator", "compare",
                "describe", "runmodel", "metrics", "theme", "settings", "kvview", "pages", "tree_settings",
                "tree_inspect", "plot_scroll")
FORBIDDEN = ("torch", "transformers", "sqlalchemy", "specscope.storage", "sqlite3")


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_view_modules_import_no_torch_or_sql():
    root = Path(gui.__file__).parent
    for name in VIEW_MODULES:
        bad = {m for m in imports(root / f"{name}.py") for f in FORBIDDEN if m == f or m.startswith(f + ".")}
        assert not bad, f"{name}.py imports {bad}"


def test_storage_and_core_do_not_import_qt():
    import specscope.core as core
    import specscope.storage as storage

    for pkg in (core, storage):
        for path in Path(pkg.__file__).parent.glob("*.py"):
            assert not any(m.startswith(("PySide6", "pyqtgraph", "specscope.app")) for m in imports(path)), path

"""Architecture: views take models; no torch, SQL or storage inside widget modules."""

from __future__ import annotations

import ast
from pathlib import Path

import specscope.app.gui as gui

ROOT = Path(gui.__file__).parent
# every view and model module (model/traces.py is the one GUI module that talks to storage)
VIEW_MODULES = sorted([*ROOT.glob("views/*.py"), *(p for p in ROOT.glob("model/*.py") if p.name != "traces.py"),
                       ROOT / "theme.py"])
# app/gui's folders in layers, lowest first: a folder imports only the folders below it
GUI_LAYERS = ("model", "sessions", "views", "controllers")
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
    assert len(VIEW_MODULES) > 20
    for path in VIEW_MODULES:
        bad = {m for m in imports(path) for f in FORBIDDEN if m == f or m.startswith(f + ".")}
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_gui_folders_import_only_the_folders_below():
    """model <- sessions <- views <- controllers <- main_window: the folders show the layers."""
    offenders = []
    for i, folder in enumerate(GUI_LAYERS):
        above = tuple(f"specscope.app.gui.{name}" for name in (*GUI_LAYERS[i + 1:], "main_window"))
        for path in sorted((ROOT / folder).glob("*.py")):
            offenders += [f"{folder}/{path.name} imports {m}" for m in imports(path)
                          if m.startswith(above)]
    assert offenders == []


def test_storage_and_core_do_not_import_qt():
    import specscope.core as core
    import specscope.storage as storage

    for pkg in (core, storage):
        for path in Path(pkg.__file__).parent.glob("*.py"):
            assert not any(m.startswith(("PySide6", "pyqtgraph", "specscope.app")) for m in imports(path)), path

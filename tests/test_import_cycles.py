"""No import cycle inside a package: the modules of core/, storage/ and app/ (app/gui counted
as part of app) form a DAG. Imports inside functions count too: a function-level import
only hides a cycle until the function runs."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = {"core": "specscope.core", "storage": "specscope.storage", "app": "specscope.app"}


def module_files(pkg_dir: Path, pkg_name: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module below pkg_dir (packages as their __init__)."""
    out = {}
    for path in sorted(pkg_dir.rglob("*.py")):
        parts = path.relative_to(pkg_dir).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join((pkg_name, *parts))] = path
    return out


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of a relative import `from <level dots><target> import ...`."""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imports_of(module: str, path: Path, modules: set[str]) -> set[str]:
    """The modules of `modules` that `module` imports anywhere in its file (functions included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def add(name: str) -> None:
        while name and name not in modules:  # `import a.b.c` of a name that is an attribute: its module
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module) if node.level else (node.module or "")
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in modules else base)  # `from . import x`: the submodule x, else the package
    return found


def import_graph(pkg_dir: Path, pkg_name: str) -> dict[str, set[str]]:
    files = module_files(pkg_dir, pkg_name)
    names = set(files)
    return {name: imports_of(name, path, names) for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None when the graph is a DAG."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle_inside_a_package(package):
    cycle = find_cycle(import_graph(ROOT / package, PACKAGES[package]))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    return import_graph(pkg, "specscope.pkg")


def test_the_detector_finds_a_cycle_hidden_in_functions(tmp_path):
    graph = _package(tmp_path, {
        "a.py": "def f():\n    from .b import g\n    return g\n",
        "b.py": "def g():\n    from . import a\n    return a\n",
    })
    assert graph["specscope.pkg.a"] == {"specscope.pkg.b"} and graph["specscope.pkg.b"] == {"specscope.pkg.a"}
    assert find_cycle(graph) in (["specscope.pkg.a", "specscope.pkg.b", "specscope.pkg.a"],
                                 ["specscope.pkg.b", "specscope.pkg.a", "specscope.pkg.b"])


def test_the_detector_resolves_absolute_and_parent_imports(tmp_path):
    graph = _package(tmp_path, {
        "a.py": "import specscope.pkg.b\n",
        "b.py": "class C:\n    def m(self):\n        from specscope.pkg.sub.c import x\n",
        "sub/__init__.py": "",
        "sub/c.py": "from ..a import y\nimport numpy\n",
    })
    assert graph["specscope.pkg.a"] == {"specscope.pkg.b"}
    assert graph["specscope.pkg.b"] == {"specscope.pkg.sub.c"}
    assert graph["specscope.pkg.sub.c"] == {"specscope.pkg.a"}
    assert find_cycle(graph) is not None
    del graph["specscope.pkg.sub.c"]
    assert find_cycle(graph) is None

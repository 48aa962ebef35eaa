"""GGUF files as checkpoints: dequantised once by transformers, cached as a safetensors folder.

A GGUF file (llama.cpp's format) holds quantised weights and the tokenizer in its metadata.
transformers reads it (the `gguf` package) and dequantises every tensor to float32, which takes
from seconds to minutes. specscope does that once per file and keeps the result as an ordinary
checkpoint folder (config.json, model.safetensors, generation_config.json, the tokenizer) in the
user's cache, keyed by the file's SHA-256, so the next load is a plain safetensors load:

    <cache>/gguf/<sha256>/            <cache>: $SPECSCOPE_CACHE, else $XDG_CACHE_HOME/specscope,
        config.json ...                        else ~/.cache/specscope
        specscope-gguf.json           what was converted: the file, its architecture, the time

The folder appears whole or not at all (written beside it, then renamed), so an interrupted
conversion leaves nothing that a later load could mistake for a checkpoint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from specscope.core.loading.errors import CheckpointError

MAGIC = b"GGUF"
MARKER = "specscope-gguf.json"
# GGUF architectures that transformers reads but that are not causal language models
NOT_CAUSAL = {"t5": "an encoder-decoder (T5)", "umt5": "an encoder-decoder (UMT5)"}

Progress = Callable[[str], None]


def is_gguf(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is a file that starts with GGUF's magic bytes."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            return p.is_file() and f.read(4) == MAGIC
    except OSError:
        return False


def cache_root() -> Path:
    """Where converted models are kept: $SPECSCOPE_CACHE, $XDG_CACHE_HOME/specscope or ~/.cache/specscope."""
    if os.environ.get("SPECSCOPE_CACHE"):
        return Path(os.environ["SPECSCOPE_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "specscope"
    try:
        return Path.home() / ".cache" / "specscope"
    except RuntimeError as exc:  # no HOME and no passwd entry
        raise CheckpointError("no cache folder for converted models: set SPECSCOPE_CACHE (or HOME)") from exc


def file_sha256(path: Path, progress: Progress | None = None) -> str:
    h = hashlib.sha256()
    size, done, shown = path.stat().st_size, 0, -1
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
            done += len(chunk)
            percent = 100 * done // max(size, 1)
            if progress is not None and percent // 25 != shown:
                shown = percent // 25
                progress(f"checksum {percent}% of {size / 1e6:.0f} MB")
    return h.hexdigest()


def architecture(path: Path) -> str:
    """The file's `general.architecture`, read from its metadata (CheckpointError when unreadable)."""
    try:
        from gguf import GGUFReader
    except ImportError as exc:
        raise CheckpointError("reading GGUF files needs the gguf package: pip install gguf") from exc
    try:
        reader = GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    except KeyError as exc:
        raise CheckpointError(f"{path} is a GGUF file without general.architecture in its metadata") from exc
    except Exception as exc:  # a truncated or corrupt file: numpy/struct errors of every kind
        raise CheckpointError(f"{path} is not a readable GGUF file (truncated or corrupt): {exc}") from exc


def check_supported(arch: str, path: Path) -> None:
    """Refuse, in one line, a GGUF architecture specscope cannot decode."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    if arch in NOT_CAUSAL:
        raise CheckpointError(f"{path} holds {NOT_CAUSAL[arch]} model: specscope decodes causal language models")
    if arch not in GGUF_SUPPORTED_ARCHITECTURES:
        readable = ", ".join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer", *NOT_CAUSAL))
        raise CheckpointError(f"{path}: transformers cannot read GGUF architecture {arch!r} (it reads {readable})")


def converted_checkpoint(
    path: str | os.PathLike[str], progress: Progress | None = None, digest: str | None = None
) -> Path:
    """The cached checkpoint folder of a GGUF file, converting it first when it is not cached
    yet. `digest`: the file's SHA-256 when the caller has just checked it (not read again)."""
    src = Path(path).expanduser().resolve()
    if not is_gguf(src):
        raise CheckpointError(f"{src} is not a GGUF file (it does not start with the GGUF magic bytes)")
    digest = digest or file_sha256(src, progress)
    folder = cache_root() / "gguf" / digest
    if (folder / MARKER).is_file():
        return folder
    arch = architecture(src)
    check_supported(arch, src)
    _convert(src, arch, digest, folder, progress)
    return folder


def _convert(src: Path, arch: str, digest: str, folder: Path, progress: Progress | None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot create the model cache {folder.parent}: {exc.strerror}") from exc
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=f".{digest[:12]}-", dir=folder.parent))
    try:
        say = progress or (lambda _message: None)
        say(f"reading the tokenizer of {src.name}")
        tokenizer = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
        say(f"dequantising the weights of {src.name} ({arch}) to float32")
        with _tensor_progress(say):
            model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
        # the weights are plain float32 tensors now: save them as an unquantised checkpoint
        model.hf_quantizer = None  # type: ignore[assignment]  # nn.Module.__setattr__ is typed Tensor | Module only
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        say(f"saving the checkpoint in {folder}")
        model.save_pretrained(work)
        tokenizer.save_pretrained(work)
        info = {
            "source": str(src),
            "sha256": digest,
            "architecture": arch,
            "model_type": model.config.model_type,
            "seconds": round(time.perf_counter() - started, 1),
        }
        (work / MARKER).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        try:
            work.rename(folder)
        except OSError:
            if not (folder / MARKER).is_file():  # not another process that finished first
                raise
    except CheckpointError:
        raise
    except OSError as exc:
        raise CheckpointError(f"cannot write the converted model to {folder.parent}: {exc}") from exc
    except Exception as exc:  # transformers' own refusals, as one line
        raise CheckpointError(f"transformers cannot convert {src.name} ({arch}): {exc}") from exc
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _tensor_progress(say: Progress) -> Iterator[None]:
    """transformers dequantises with its own tqdm bar on stderr ("Converting and de-quantizing
    GGUF tensors...", one carriage-returned line per tensor in a log or a pipe): report it
    as specscope's progress lines instead, one every quarter, while the conversion runs."""
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # another transformers layout: its own bar stays
        yield
        return
    if not hasattr(gguf_utils, "tqdm"):
        yield
        return

    def quarters(items: Iterable[Any], desc: str | None = None, **_kwargs: Any) -> Iterator[Any]:
        items = list(items)
        shown = -1
        for i, item in enumerate(items):
            quarter = 4 * i // max(1, len(items))
            if quarter != shown:
                shown = quarter
                say(f"dequantising: {25 * quarter}% of {len(items)} tensors")
            yield item
        say(f"dequantising: 100% of {len(items)} tensors")

    original = gguf_utils.tqdm
    gguf_utils.tqdm = quarters
    try:
        yield
    finally:
        gguf_utils.tqdm = original


def conversion_info(folder: Path) -> dict[str, Any] | None:
    """What specscope-gguf.json says about a cached conversion (None for any other folder)."""
    try:
        info: dict[str, Any] | None = json.loads((folder / MARKER).read_text(encoding="utf-8"))
        return info
    except (OSError, ValueError):
        return None

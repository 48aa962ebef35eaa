"""Loading models offline: the bundled set by name, or any local checkpoint pair by path.

    from specscope.core.loading.models import load_bundled, load_pair, load_models
    pair = load_bundled("small")                     # bundled target + draft-small
    pair = load_bundled("tiny", device="cpu")        # bundled target + draft-tiny
    pair = load_pair("/ckpt/target", "/ckpt/draft")  # any local transformers checkpoints
    pair = load_models(target=None, draft="tiny")    # what the CLI's flags resolve to

Everything loads with `local_files_only=True` and `trust_remote_code=False`: nothing is
downloaded and no checkpoint code runs. The bundled weights are stored as bfloat16 and
upcast to float32 on load unless another dtype is asked for.

The tokenizer contract (`check_tokenizers`): a target and a draft may only be paired when
their tokenizers encode and decode alike: identical token -> id maps, special and added
tokens, pre-tokenizer, model (merges) and post-processor pieces, normalizers that leave text
in NFC form alike, and the same ids and text on probe texts. Equal vocabulary sizes are not
enough. A difference that changes no id (an NFC normalizer one model class adds to the same
tokenizer.json) is a warning (`tokenizer_warnings`), not a refusal.

Importing this module imports neither torch nor transformers (the functions that load import
them): the window reads its constants and paths while torch is still loading in the background.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specscope.core.loading import catalog, gguf
from specscope.core.loading.errors import CheckpointError

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

BUNDLED_DRAFTS = ("small", "tiny")
# Drafts bundled for a fetchable target (core.loading.catalog's default_draft), by folder name.
BUNDLED_REAL_DRAFTS = ("smollm2-draft",)
# Draft heads trained for the bundled target (core.draft.registry's BUNDLED_HEADS), by folder name.
BUNDLED_HEADS = ("eagle3-target",)
# Draft heads trained for a fetchable target (core.loading.catalog's default_heads), by folder name.
BUNDLED_REAL_HEADS = ("eagle3-smollm2",)
BUNDLED_PREFIX = "specscope/"  # config._name_or_path of bundled models: "specscope/target", ...
_TARGET_ALIASES = {"target", "bundled", "specscope/target", "bundled:target"}

# dtype names -> torch's attribute names (torch.float32, ...): looked up when asked for.
_DTYPE_NAMES: dict[str, str] = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float64": "float64",
    "fp64": "float64",
    "double": "float64",
}


# ---------------------------------------------------------------------------- paths


def resources_dir() -> Path:
    """The installed package's resources folder (specscope.resources)."""
    from specscope import resources

    return Path(resources.__file__).resolve().parent


def models_dir() -> Path:
    return resources_dir() / "models"


def prompts_dir() -> Path:
    return resources_dir() / "prompts"


def bundled_path(name: str) -> Path:
    """Folder of a bundled model: "target", "small"/"draft-small", "tiny"/"draft-tiny", "tokenizer"."""
    key = _bundled_key(name)
    if key is None:
        raise ValueError(
            f"unknown bundled model {name!r}: choose 'target', 'tokenizer' or a draft: "
            + ", ".join(repr(d) for d in BUNDLED_DRAFTS)
        )
    path = models_dir() / key
    if not (path / "config.json").is_file() and key != "tokenizer":
        raise CheckpointError(
            f"the bundled model {key!r} is missing from {path} (is the package installed with its resources?)"
        )
    return path


def bundled_head_path(name: str) -> Path:
    """Folder of a bundled draft head (config.json and its weights)."""
    if name not in BUNDLED_HEADS + BUNDLED_REAL_HEADS:
        raise ValueError(
            f"unknown bundled head {name!r}: choose {', '.join(repr(h) for h in BUNDLED_HEADS + BUNDLED_REAL_HEADS)}"
        )
    path = models_dir() / name
    if not (path / "config.json").is_file():
        raise CheckpointError(
            f"the bundled head {name!r} is missing from {path} (is the package installed with its resources?)"
        )
    return path


def _bundled_key(name: str) -> str | None:
    n = str(name).strip().lower().removeprefix(BUNDLED_PREFIX).removeprefix("bundled:")
    if n in ("target", "bundled", "tokenizer"):
        return "target" if n == "bundled" else n
    if n in BUNDLED_REAL_DRAFTS:
        return n
    n = n.removeprefix("draft-")
    if n in BUNDLED_DRAFTS:
        return f"draft-{n}"
    return None


# ---------------------------------------------------------------------------- device / dtype


def resolve_device(device: str | torch.device | None = "auto") -> torch.device:
    """ "auto" -> cuda when available, else cpu; "cpu"; "cuda" / "cuda:N" (must be available)."""
    import torch

    if isinstance(device, torch.device):
        spec = str(device)
    else:
        spec = "auto" if device is None else str(device).strip().lower()
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {spec!r} was asked for but CUDA is not available (torch {torch.__version__}); use 'cpu' or "
                "'auto'"
            )
        dev = torch.device(spec)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device {spec!r} does not exist: {torch.cuda.device_count()} CUDA device(s)")
        return dev
    if spec == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ValueError("device 'mps' was asked for but is not available")
        return torch.device("mps")
    raise ValueError(f"unknown device {device!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N'")


def resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype:
    """None -> float32 (exact p/q for the inspector); names like "bf16", "float16" or a torch.dtype."""
    import torch

    if dtype is None:
        return torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).strip().lower().removeprefix("torch.")
    if key not in _DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {sorted(_DTYPE_NAMES)}")
    dt: torch.dtype = getattr(torch, _DTYPE_NAMES[key])
    return dt


# ---------------------------------------------------------------------------- tokenizer contract


def _backend_json(tok: Any) -> dict[str, Any] | None:
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        data: dict[str, Any] | None = json.loads(backend.to_str())
        return data
    except Exception:  # noqa: BLE001 - a tokenizer without a serialisable backend
        return None


def _special_tokens(tok: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for attr in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"):
        value = getattr(tok, attr, None)
        out[attr] = None if value is None else str(value)
        out[attr + "_id"] = getattr(tok, attr + "_id", None) if value is not None else None
    extra = getattr(tok, "additional_special_tokens", None) or getattr(tok, "extra_special_tokens", None) or []
    if isinstance(extra, Mapping):
        extra = list(extra.values())
    out["additional_special_tokens"] = sorted(str(t) for t in extra)
    return out


def _added_tokens(tok: Any) -> dict[int, tuple[str, bool]]:
    decoder = getattr(tok, "added_tokens_decoder", None) or {}
    return {int(i): (str(t), bool(getattr(t, "special", False))) for i, t in decoder.items()}


def _first_vocab_difference(va: Mapping[str, int], vb: Mapping[str, int], na: str, nb: str) -> str | None:
    for token, ida in sorted(va.items(), key=lambda kv: (kv[1], kv[0])):
        idb = vb.get(token)
        if idb is None:
            return f"token {token!r} (id {ida} in the {na} tokenizer) is missing from the {nb} tokenizer"
        if idb != ida:
            return f"token {token!r} has id {ida} in the {na} tokenizer but id {idb} in the {nb} tokenizer"
    for token, idb in sorted(vb.items(), key=lambda kv: (kv[1], kv[0])):
        if token not in va:
            return f"token {token!r} (id {idb} in the {nb} tokenizer) is missing from the {na} tokenizer"
    return None


def _first_json_difference(a: Any, b: Any, where: str) -> str | None:
    """Path and values of the first difference between two JSON values, in document order."""
    if type(a) is not type(b):
        return f"{where}: {_short(a)} vs {_short(b)}"
    if isinstance(a, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if key not in a or key not in b:
                return f"{where}.{key}: {_short(a.get(key, '<absent>'))} vs {_short(b.get(key, '<absent>'))}"
            diff = _first_json_difference(a[key], b[key], f"{where}.{key}")
            if diff:
                return diff
        return None
    if isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b)):
            diff = _first_json_difference(x, y, f"{where}[{i}]")
            if diff:
                return diff
        if len(a) != len(b):
            return f"{where}: {len(a)} entries vs {len(b)}"
        return None
    return None if a == b else f"{where}: {_short(a)} vs {_short(b)}"


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def tokenizer_difference(tok_a: Any, tok_b: Any, names: tuple[str, str] = ("target", "draft")) -> str | None:
    """A sentence naming the first difference between two tokenizers that can change token ids
    or the text of ids, or None when they encode and decode alike (`tokenizer_warnings` names
    the differences that cannot)."""
    return _tokenizer_comparison(tok_a, tok_b, names)[0]


def compare_tokenizers(
    tok_a: Any, tok_b: Any, names: tuple[str, str] = ("target", "draft")
) -> tuple[str | None, list[str]]:
    """(`tokenizer_difference`, `tokenizer_warnings`) from one comparison (it parses both
    tokenizers' JSON: most of a second for SmolLM2's pair)."""
    refusal, warnings = _tokenizer_comparison(tok_a, tok_b, names)
    return refusal, [] if refusal else warnings


def tokenizer_warnings(tok_a: Any, tok_b: Any, names: tuple[str, str] = ("target", "draft")) -> list[str]:
    """The differences between two tokenizers that change no id of text given in NFC form (the
    form text is typed and stored in) and no text of an id: e.g. an NFC normalizer that one
    model class adds to the same tokenizer.json. Empty when they refuse (`tokenizer_difference`)."""
    refusal, warnings = _tokenizer_comparison(tok_a, tok_b, names)
    return [] if refusal else warnings


def check_tokenizers(tok_a: Any, tok_b: Any, names: tuple[str, str] = ("target", "draft")) -> list[str]:
    """Raise ValueError naming the first difference that can change ids unless the two tokenizers
    are interchangeable; return (and log) the harmless differences as warnings."""
    refusal, warnings = _tokenizer_comparison(tok_a, tok_b, names)
    if refusal:
        raise ValueError(
            f"the {names[0]} and {names[1]} tokenizers differ: {refusal}; a draft must share the target's tokenizer"
        )
    for warning in warnings:
        log.warning("the %s and %s tokenizers differ harmlessly: %s", names[0], names[1], warning)
    return warnings


# Texts in NFC form (as prompts are typed and stored) that tell tokenizer pipelines apart: code,
# contractions, digit runs, case, accents, compatibility characters (NFKC changes them), scripts
# without spaces, emoji, whitespace runs. Two tokenizers whose normalizers agree on these and
# whose pre-tokenizers, merges and post-processors are the same encode text alike.
PROBE_TEXTS = (
    "in 2024, 12345",
    "def f(x):\n    return x + 1  # add one\n",
    "It's 2024; we'll see 12345 items, they're READY. I'd've known",
    "Café, naïve, résumé, Ærøskøbing, straße, İstanbul, ŞİŞLİ",
    "ﬁne ﬂow ½ x² ① ＡＢＣ ™ …",
    "中文字符 日本語のテキスト 한국어 Ελληνικά русский العربية",
    "🙂👍🏽 🇫🇷 ❤️",
    "  two  spaces\t\ttabs\n\n\nnewlines \r\n end ",
)


def _probe_texts(tok: Any) -> list[str]:
    specials = [t for t in _special_tokens(tok).values() if isinstance(t, str)]
    return [*PROBE_TEXTS, *(f"a{s}b {s}" for s in sorted(set(specials)))]


def _normalized(json_tok: Any, text: str) -> str:
    normalizer = getattr(json_tok, "normalizer", None)
    return text if normalizer is None else str(normalizer.normalize_str(text))


def _same_option(a: Any, b: Any) -> bool:
    return a == b or (a in (None, "") and b in (None, ""))  # "" and null: no prefix / suffix either way


def _first_coding_difference(tok_a: Any, tok_b: Any, texts: Iterable[str], names: tuple[str, str]) -> str | None:
    """The shortest text that encodes to different ids, or whose ids decode to different text."""
    na, nb = names
    for text in sorted(texts, key=len):
        ids_a, ids_b = list(tok_a.encode(text)), list(tok_b.encode(text))
        if ids_a != ids_b:
            return f"{text!r} encodes to {_short(ids_a)} in the {na} tokenizer vs {_short(ids_b)} in the {nb}"
        text_a, text_b = tok_a.decode(ids_a), tok_b.decode(ids_a)
        if text_a != text_b:
            return f"ids {_short(ids_a)} decode to {text_a!r} in the {na} tokenizer vs {text_b!r} in the {nb}"
    return None


def _tokenizer_comparison(tok_a: Any, tok_b: Any, names: tuple[str, str]) -> tuple[str | None, list[str]]:
    """(the first difference that can change ids or text, or None; the harmless differences)."""
    na, nb = names
    diff = _first_vocab_difference(tok_a.get_vocab(), tok_b.get_vocab(), na, nb)
    if diff:
        return diff, []
    sa, sb = _special_tokens(tok_a), _special_tokens(tok_b)
    for key in sa:
        if sa[key] != sb.get(key):
            return (
                f"special token {key}: {sa[key]!r} in the {na} tokenizer vs {sb.get(key)!r} in the {nb} tokenizer"
            ), []
    aa, ab = _added_tokens(tok_a), _added_tokens(tok_b)
    for i in sorted(set(aa) | set(ab)):
        if aa.get(i) != ab.get(i):
            fa = aa.get(i, ("<absent>", False))
            fb = ab.get(i, ("<absent>", False))
            return (
                f"added token id {i}: {fa[0]!r} (special={fa[1]}) in the {na} tokenizer vs "
                f"{fb[0]!r} (special={fb[1]}) in the {nb} tokenizer"
            ), []
    warnings: list[str] = []
    ja, jb = _backend_json(tok_a), _backend_json(tok_b)
    if (ja is None) != (jb is None):
        return f"only the {na if ja is not None else nb} tokenizer has a fast (tokenizers) backend", []
    texts = _probe_texts(tok_a)
    if ja is not None and jb is not None:
        for piece in ("normalizer", "pre_tokenizer", "model", "post_processor", "decoder"):
            pa, pb = ja.get(piece), jb.get(piece)
            if piece == "model" and isinstance(pa, dict) and isinstance(pb, dict):
                # the vocab was compared above; "" and null options mean the same
                keys = [
                    k
                    for k in (*pa, *(k for k in pb if k not in pa))
                    if k != "vocab" and not _same_option(pa.get(k), pb.get(k))
                ]
                pa, pb = {k: pa.get(k) for k in keys}, {k: pb.get(k) for k in keys}
            diff = _first_json_difference(pa, pb, piece)
            if not diff:
                continue
            where = f"{piece} differs ({na} vs {nb}) at {diff}"
            if piece == "normalizer":  # harmless when both leave text as given (NFC) alike
                ba, bb = tok_a.backend_tokenizer, tok_b.backend_tokenizer
                changed = next((t for t in texts if _normalized(ba, t) != _normalized(bb, t)), None)
                if changed is not None:
                    return (
                        f"{where}: {changed!r} normalizes to {_normalized(ba, changed)!r} vs "
                        f"{_normalized(bb, changed)!r}"
                    ), []
                warnings.append(
                    f"{where}; both normalize text in NFC form alike, so its ids are the same "
                    f"(text in another Unicode form may encode differently)"
                )
            elif piece == "decoder":  # harmless when every id decodes to the same text
                continue  # the decode probes below decide
            else:  # a different split, merge or added token can change ids on some text
                example = _first_coding_difference(tok_a, tok_b, texts, names)
                return where + (f": {example}" if example else " (the probe texts encode alike; others may not)"), []
    example = _first_coding_difference(tok_a, tok_b, texts, names)  # the Python-level options too (BOS, prefix space)
    if example:
        return example, []
    if ja is not None and jb is not None and ja.get("decoder") != jb.get("decoder"):
        size = len(tok_a.get_vocab())
        for start in range(0, size, 512):  # every id, in runs (a decoder joins neighbours)
            ids = list(range(start, min(start + 512, size)))
            if tok_a.decode(ids) != tok_b.decode(ids):
                return f"decoder differs ({na} vs {nb}): ids {start}..{ids[-1]} decode to different text", []
        decoder_at = _first_json_difference(ja.get("decoder"), jb.get("decoder"), "decoder")
        warnings.append(f"decoder differs ({na} vs {nb}) at {decoder_at}; every id decodes to the same text")
    return None, warnings


# ---------------------------------------------------------------------------- loading


def max_positions(model: torch.nn.Module) -> int | None:
    """The longest sequence a model's config admits (max_position_embeddings; n_positions for
    GPT-2 style configs); None when the config states none."""
    config = getattr(model, "config", None)
    for attr in ("max_position_embeddings", "n_positions"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def position_limit(models: Any) -> tuple[int, str] | None:
    """The most positions (prompt + new tokens) both of `models` (anything with target,
    draft, target_name and draft_name: a ModelPair, core.decode.factory.Models) can read, and
    the name of the model that sets it; None when neither config states a limit."""
    limits = []
    for role in ("target", "draft"):
        model = getattr(models, role, None)
        n = max_positions(model) if model is not None else None
        if n is not None and model is not None:  # (n is None without a model)
            name = getattr(models, f"{role}_name", None) or getattr(model.config, "_name_or_path", "") or f"the {role}"
            limits.append((n, name))
    return min(limits, key=lambda item: item[0]) if limits else None


@dataclass
class ModelPair:
    """A target, an optional draft, and their shared tokenizer, ready for the decoder.

    `model` is the model a name selected: the draft for load_bundled("small"/"tiny") and
    load_models(draft=...), the target when no draft was asked for.
    """

    target: torch.nn.Module
    draft: torch.nn.Module | None
    tokenizer: Any | None
    target_name: str
    draft_name: str | None
    device: torch.device
    dtype: torch.dtype
    target_path: Path | None = None
    draft_path: Path | None = None
    hashes: dict[str, str | None] = field(default_factory=dict)

    @property
    def model(self) -> torch.nn.Module:
        return self.draft if self.draft is not None else self.target

    @property
    def eos_token_id(self) -> int | None:
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            return int(self.tokenizer.eos_token_id)
        eos = getattr(self.target.config, "eos_token_id", None)
        return eos if isinstance(eos, int) else None

    def position_limit(self) -> tuple[int, str] | None:
        """The most positions (prompt + new tokens) both models can read, and the name of the
        model that sets it; None when neither config states a limit."""
        return position_limit(self)

    def model_info(self) -> dict[str, str | None]:
        """Names and sha256 hashes of the weights and tokenizer (storage's ModelInfo keys)."""
        return {
            "target_name": self.target_name,
            "target_hash": self.hashes.get("target"),
            "draft_name": self.draft_name,
            "draft_hash": self.hashes.get("draft"),
            "tokenizer_name": self.target_name if self.tokenizer is not None else None,
            "tokenizer_hash": self.hashes.get("tokenizer"),
        }

    def __iter__(self) -> Iterator[Any]:  # (target, draft, tokenizer) unpacking
        return iter((self.target, self.draft, self.tokenizer))


def _file_sha256(path: Path) -> str | None:
    return gguf.file_sha256(path) if path.is_file() else None


def _weights_sha256(folder: Path) -> str | None:
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("*.bin"))
    if not files:
        return None
    if len(files) == 1:
        return _file_sha256(files[0])
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + (_file_sha256(f) or "").encode())
    return h.hexdigest()


def _checkpoint_dir(path: str | os.PathLike[str], role: str, progress: gguf.Progress | None = None) -> Path:
    """The checkpoint folder `path` names: the folder itself, a GGUF file's cached conversion
    (converted first when needed), or a fetched model's by name (core.loading.catalog)."""
    p = Path(path).expanduser()
    if p.is_file() and gguf.is_gguf(p):
        return gguf.converted_checkpoint(p, progress)
    if p.is_file() and p.suffix.lower() == ".gguf":
        raise CheckpointError(f"{role} {p} is named .gguf but is not a GGUF file (it lacks the GGUF magic bytes)")
    if not p.exists() and catalog.lookup(str(path)) is not None:
        return catalog.resolve(str(path), progress)
    if not p.exists():
        raise CheckpointError(
            f"{role} checkpoint not found: {p} does not exist (expected a local folder saved with save_pretrained)"
        )
    if not p.is_dir():
        raise CheckpointError(
            f"{role} checkpoint {p} is a file; expected a folder saved with save_pretrained (config.json + weights)"
        )
    if not (p / "config.json").is_file():
        raise CheckpointError(f"{role} checkpoint {p} has no config.json: not a transformers model folder")
    if not any(p.glob("*.safetensors")) and not any(p.glob("*.bin")):
        raise CheckpointError(f"{role} checkpoint {p} has a config.json but no weights (*.safetensors or *.bin)")
    return p.resolve()


def _model_config(folder: Path, role: str) -> dict[str, Any]:
    """config.json of a checkpoint folder (a CheckpointError when it is not a JSON object)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{role} checkpoint {folder}: config.json is unreadable ({exc})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{role} checkpoint {folder}: config.json is not a JSON object")
    return config


def check_causal(folder: Path, role: str = "model") -> dict[str, Any]:
    """Refuse, in one line, a checkpoint transformers cannot load as a causal language model
    (an encoder-decoder such as T5, an encoder such as BERT, a model_type it does not know);
    return its config."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = _model_config(folder, role)
    kind = config.get("model_type")
    if kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return config
    shape = (
        "an encoder-decoder model"
        if config.get("is_encoder_decoder")
        else "a model whose type transformers does not know"
        if kind is None or _remote_class(config)
        else "not a causal language model"
    )
    classes = ", ".join(map(str, config.get("architectures") or [])) or "no architectures listed"
    raise CheckpointError(
        f"{role} checkpoint {folder} is {shape} (model_type {kind!r}: {classes}); specscope decodes "
        f"causal language models (decoder-only, what AutoModelForCausalLM loads) and never runs a "
        f"checkpoint's own code"
    )


def _remote_class(config: Mapping[str, Any]) -> str | None:
    """The causal-LM class a config's auto_map asks transformers to import from the
    checkpoint's own code (None when it asks for none)."""
    auto_map = config.get("auto_map")
    if not isinstance(auto_map, dict):
        return None
    found = auto_map.get("AutoModelForCausalLM") or next(iter(auto_map.values()), None)
    return str(found[0] if isinstance(found, (list, tuple)) and found else found) if found else None


def _warn_remote_code(folder: Path, config: Mapping[str, Any], model: torch.nn.Module, role: str) -> None:
    remote = _remote_class(config)
    if remote:
        log.warning(
            "%s checkpoint %s asks for its own code (auto_map: %s); that code was not run: loaded with "
            "transformers' %s instead",
            role,
            folder,
            remote,
            type(model).__name__,
        )


def tokenizer_sha256(folder: str | os.PathLike[str]) -> str | None:
    """What a run records as its tokenizer_hash: the sha256 of the folder's tokenizer.json."""
    return _file_sha256(Path(folder) / "tokenizer.json")


def _has_tokenizer(folder: Path) -> bool:
    return any(
        (folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
    )


def load_tokenizer(path: str | os.PathLike[str]) -> Any:
    from transformers import AutoTokenizer

    folder = Path(path).expanduser()
    if folder.is_file() and gguf.is_gguf(folder):
        folder = gguf.converted_checkpoint(folder)
    if not folder.is_dir() or not _has_tokenizer(folder):
        raise CheckpointError(f"no tokenizer in {folder} (expected tokenizer.json / tokenizer_config.json)")
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # report which folder failed
        raise CheckpointError(f"cannot load the tokenizer in {folder}: {exc}") from exc


def load_model(
    path: str | os.PathLike[str],
    device: str | torch.device = "auto",
    dtype: str | torch.dtype | None = None,
    role: str = "model",
    device_map: str | dict[str, Any] | None = None,
    offload_folder: str | os.PathLike[str] | None = None,
    progress: gguf.Progress | None = None,
) -> torch.nn.Module:
    """One local causal LM, in eval mode on `device`, with float parameters cast to `dtype`.

    `device_map` (needs the accelerate package) spreads the model's layers over several
    devices instead ("auto", "balanced", or a {module name: device} dict; "disk" offloads to
    `offload_folder`); `device` is then ignored. docs/scale.md says what the decoder does
    with such a model."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = _checkpoint_dir(path, role, progress)
    config = check_causal(folder, role)
    dt = resolve_dtype(dtype)
    extra: dict[str, Any] = {}
    if device_map is not None:
        if importlib.util.find_spec("accelerate") is None:
            raise CheckpointError("device_map needs the accelerate package: pip install accelerate")
        extra = {"device_map": device_map, "offload_folder": str(offload_folder) if offload_folder else None}
    try:
        model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dt, local_files_only=True, trust_remote_code=False, **extra
        )
    except Exception as exc:  # report which folder failed and why
        raise CheckpointError(f"cannot load the {role} checkpoint {folder}: {exc}") from exc
    _warn_remote_code(folder, config, model, role)
    on = None if device_map is not None else resolve_device(device)  # None: accelerate placed the layers
    model = model.eval() if on is None else model.to(device=on, dtype=dt).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    if on is not None and on.type == "cpu" and dt == torch.float32:
        from specscope.core import kernels

        kernels.install(model)  # 1-16 positions per forward: each weight read once (core.kernels.few_rows)
    return model


def load_pair(
    target_path: str | os.PathLike[str],
    draft_path: str | os.PathLike[str] | None = None,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype | None = None,
    target_name: str | None = None,
    draft_name: str | None = None,
    progress: gguf.Progress | None = None,
) -> ModelPair:
    """Any local transformers checkpoint pair (draft optional), with the tokenizer contract checked.

    The tokenizer comes from the target folder (None when it has none: pass token ids). When
    the draft folder also has a tokenizer, the two must agree (`check_tokenizers`).
    """
    t_dir = _checkpoint_dir(target_path, "target", progress)
    d_dir = _checkpoint_dir(draft_path, "draft", progress) if draft_path is not None else None
    tokenizer = load_tokenizer(t_dir) if _has_tokenizer(t_dir) else None
    if d_dir is not None and _has_tokenizer(d_dir):
        draft_tok = load_tokenizer(d_dir)
        if tokenizer is None:
            raise CheckpointError(
                f"the draft {d_dir} has a tokenizer but the target {t_dir} has none: cannot check they match"
            )
        check_tokenizers(tokenizer, draft_tok)
    elif d_dir is not None:
        log.warning("draft %s has no tokenizer files; assuming it shares the target's", d_dir)
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    target = load_model(t_dir, dev, dt, role="target")
    draft = load_model(d_dir, dev, dt, role="draft") if d_dir is not None else None
    if draft is not None:
        from specscope.core.decode.kv import model_vocab_size

        vt, vd = model_vocab_size(target), model_vocab_size(draft)
        if vt != vd:
            raise ValueError(
                f"target and draft vocabularies differ: the target's logits have {vt} entries, the draft's {vd}"
            )
    hashes = {
        "target": _weights_sha256(t_dir),
        "draft": _weights_sha256(d_dir) if d_dir is not None else None,
        "tokenizer": tokenizer_sha256(t_dir),
    }
    return ModelPair(
        target=target,
        draft=draft,
        tokenizer=tokenizer,
        target_name=target_name or str(t_dir),
        draft_name=(draft_name or str(d_dir)) if d_dir is not None else None,
        device=dev,
        dtype=dt,
        target_path=t_dir,
        draft_path=d_dir,
        hashes=hashes,
    )


def load_bundled(
    name: str = "small", device: str | torch.device = "auto", dtype: str | torch.dtype | None = None
) -> ModelPair:
    """The bundled target with a bundled draft: name "small" / "tiny" (or "draft-small" / "draft-tiny").

    name "target" loads the target alone (draft None). `pair.model` is the named model.
    Models are named "specscope/target", "specscope/draft-small", ... (stable across machines).
    """
    key = _bundled_key(name)
    if key is None or key == "tokenizer":
        raise ValueError(f"unknown bundled model {name!r}: use 'small', 'tiny' or 'target'")
    draft_key = None if key == "target" else key
    pair = load_pair(
        bundled_path("target"),
        bundled_path(draft_key) if draft_key else None,
        device=device,
        dtype=dtype,
        target_name=BUNDLED_PREFIX + "target",
        draft_name=BUNDLED_PREFIX + draft_key if draft_key else None,
    )
    _name(pair.target, pair.target_name)
    if pair.draft is not None:
        _name(pair.draft, pair.draft_name)
    return pair


def _name(model: torch.nn.Module, name: str | None) -> None:
    """`name` as the model's config's _name_or_path (a transformers model: nn.Module types
    its attributes Tensor | Module)."""
    config: Any = model.config
    config._name_or_path = name


def load_models(
    target: str | os.PathLike[str] | None = None,
    draft: str | os.PathLike[str] | None = "small",
    device: str | torch.device = "auto",
    dtype: str | torch.dtype | None = None,
    progress: gguf.Progress | None = None,
) -> ModelPair:
    """What the CLI's --target / --draft flags mean.

    target: None (or "target"/"specscope/target") = the bundled target; a fetched model's name
    ("smollm2", core.loading.catalog); else a local path: a checkpoint folder or a GGUF file.
    draft: None = no draft; "small"/"tiny" (or "specscope/draft-small", ...) = bundled; else a path.

    A bundled name always means the bundled model, even when the working directory holds a
    folder of that name: write "./small" for that folder. Anything else is a path.
    """
    t_spec = None if target is None else str(target)
    d_spec = None if draft is None else str(draft)
    bundled_target = t_spec is None or t_spec.strip().lower() in _TARGET_ALIASES
    d_key = _bundled_key(d_spec) if d_spec is not None else None
    bundled_draft = d_key is not None and (d_key.startswith("draft-") or d_key in BUNDLED_REAL_DRAFTS)
    # (bundled_draft implies d_key, and not bundled_target implies t_spec)
    if bundled_target and (d_spec is None or (bundled_draft and d_key is not None and d_key.startswith("draft-"))):
        return load_bundled(
            d_key.removeprefix("draft-") if bundled_draft and d_key is not None else "target",
            device=device,
            dtype=dtype,
        )
    t_path = Path(t_spec) if t_spec is not None and not bundled_target else bundled_path("target")
    d_path = None
    if d_spec is not None:
        d_path = bundled_path(d_key) if bundled_draft and d_key is not None else Path(d_spec)
    pair = load_pair(
        t_path,
        d_path,
        device=device,
        dtype=dtype,
        target_name=BUNDLED_PREFIX + "target" if bundled_target else _catalog_name(t_spec),
        draft_name=(BUNDLED_PREFIX + d_key) if bundled_draft and d_key is not None else _catalog_name(d_spec),
        progress=progress,
    )
    if bundled_target:
        _name(pair.target, pair.target_name)
    if bundled_draft and pair.draft is not None:
        _name(pair.draft, pair.draft_name)
    return pair


def _catalog_name(spec: str | None) -> str | None:
    """A fetched model's name when `spec` names one (and is not a path that exists)."""
    if spec is None or Path(spec).expanduser().exists():
        return None
    model = catalog.lookup(spec)
    return model.name if model is not None else None


def model_table() -> dict[str, list[dict[str, Any]]]:
    """Every model specscope can name, by where it comes from: bundled, converted in the cache,
    fetchable (core.loading.catalog.listing). `specscope models` prints it; the app's target
    menu lists it."""
    bundled = [
        {"name": name, "path": str(models_dir() / key)}
        for name, key in (
            ("target", "target"),
            *((f"draft-{d}", f"draft-{d}") for d in BUNDLED_DRAFTS),
            *((d, d) for d in BUNDLED_REAL_DRAFTS),
        )
    ]
    return {"bundled": bundled, **catalog.listing()}


def bundled_available() -> bool:
    try:
        return all((bundled_path(n) / "config.json").is_file() for n in ("target", "small", "tiny"))
    except (ValueError, CheckpointError):
        return False


# ---------------------------------------------------------------------------- example prompts


@dataclass(frozen=True)
class ExamplePrompt:
    name: str
    kind: str  # "copy" (copy-heavy: prompt lookup shines) | "novel" (the draft model shines)
    description: str
    text: str
    path: Path


def example_prompts(kind: str | None = None) -> list[ExamplePrompt]:
    """The bundled example prompts (resources/prompts/index.json order), optionally one kind.

    Texts end without trailing whitespace (see the comment below); append nothing to them.
    """
    folder = prompts_dir()
    index = folder / "index.json"
    if not index.is_file():
        raise FileNotFoundError(f"no example prompt index at {index}")
    entries = json.loads(index.read_text(encoding="utf-8"))
    out = []
    for e in entries:
        if kind is not None and e["kind"] != kind:
            continue
        path = folder / e["file"]
        # Trailing whitespace is dropped: the byte-level BPE merges a newline with the next
        # line's indentation, so a prompt ending in a bare newline would end at a token
        # boundary the models rarely saw (they then start a new top-level block).
        text = path.read_text(encoding="utf-8").rstrip()
        out.append(ExamplePrompt(e["name"], e["kind"], e.get("description", ""), text, path))
    return out


def example_prompt(name: str) -> ExamplePrompt:
    for p in example_prompts():
        if p.name == name:
            return p
    names: Iterable[str] = (p.name for p in example_prompts())
    raise KeyError(f"no example prompt {name!r}; available: {', '.join(names)}")


__all__ = [
    "BUNDLED_DRAFTS",
    "CheckpointError",
    "ExamplePrompt",
    "ModelPair",
    "bundled_available",
    "bundled_path",
    "check_tokenizers",
    "example_prompt",
    "example_prompts",
    "load_bundled",
    "load_model",
    "load_models",
    "load_pair",
    "load_tokenizer",
    "max_positions",
    "models_dir",
    "prompts_dir",
    "resolve_device",
    "resolve_dtype",
    "resources_dir",
    "tokenizer_difference",
    "tokenizer_warnings",
]

"""Train specscope's bundled models: a byte-level BPE tokenizer, a Llama target, two drafts.

Data: the Python source of the CPython standard library of the interpreter running this
script (offline on every machine, redistributable under the PSF licence). The split into
training and held-out files is by file (a hash of the relative path), so held-out prompts
never appear in training.

    nice -n 10 python training/train_models.py                  # full run (~63 min on 2 idle cores)
    python training/train_models.py --smoke --out /tmp/smoke    # a few steps, seconds

The target has two next-token stages (the second with a fresh optimiser) and two optional
fine-tuning stages against greedy loops, both off by default because neither helped enough
(docs/models.md): sequence-level unlikelihood (--stage3-steps N) and DITTO (--ditto-steps N).
Each stage can be resumed from the checkpoint of the one before (--target-stage1,
--target-stage2); --target-only stops after the target.

Outputs (under --out, default resources/models):
    tokenizer/            PreTrainedTokenizerFast (tokenizer.json, EOS "<|endoftext|>")
    target/               LlamaForCausalLM, trained on the data
    draft-small/          Llama, 1 layer, distilled from the target's soft distributions
    draft-tiny/           Llama, 1 narrow layer, distilled briefly (cheap and weak)
    train_log.txt         losses, evaluations and timings, one line per event
    training.json         the configuration, data provenance and final metrics
and ../DATA.md (data provenance) next to the models folder unless --no-data-md.

Weights are stored as bfloat16 safetensors; specscope.core.loading.models upcasts to float32.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import platform
import shutil
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

EOS = "<|endoftext|>"
REPO = Path(__file__).resolve().parent.parent

# Folders/files of the stdlib that are not ordinary Python code or not portable.
EXCLUDE_DIRS = {"test", "tests", "idle_test", "site-packages", "encodings", "pydoc_data", "__pycache__"}
EXCLUDE_PREFIXES = ("_sysconfigdata", "config-")


# ---------------------------------------------------------------------------- config


@dataclass(frozen=True)
class ModelSpec:
    layers: int
    hidden: int
    heads: int
    intermediate: int

    def config(self, vocab_size: int, eos_id: int, max_positions: int):
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=self.hidden,
            intermediate_size=self.intermediate,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.heads,
            max_position_embeddings=max_positions,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
            bos_token_id=eos_id,
            eos_token_id=eos_id,
            pad_token_id=eos_id,
        )


@dataclass(frozen=True)
class StageConfig:
    steps: int
    lr: float
    warmup: int
    batch: int
    log_every: int
    eval_every: int


@dataclass(frozen=True)
class UnlikelihoodConfig:
    """Sequence-level unlikelihood fine-tuning: odd steps are ordinary next-token steps on
    `batch` x seq_len windows; even steps decode `continuation` greedy tokens after a
    `prefix`-token training window and push down the probability of every continuation token
    that completes an `ngram` already seen earlier in the same continuation."""

    steps: int
    lr: float
    warmup: int
    batch: int
    prefix: int
    continuation: int
    ngram: int
    log_every: int
    eval_every: int


@dataclass(frozen=True)
class DittoConfig:
    """Loop-breaking fine-tuning on pseudo-repetitive data (DITTO: Xu et al., Learning to Break
    the Loop, NeurIPS 2022): odd steps are ordinary next-token steps on `batch` x seq_len
    windows; even steps show the model `prefix` real tokens followed by one training line
    (min_line..max_line tokens) repeated up to `length` tokens, and train the probability of
    each token of a repetition towards `decay` times its probability in the repetition
    before, so that copying a line becomes less likely with every copy instead of more."""

    steps: int
    lr: float
    warmup: int
    batch: int
    prefix: int
    length: int
    min_line: int
    max_line: int
    decay: float
    log_every: int
    eval_every: int


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 1234
    vocab_size: int = 4096
    seq_len: int = 512
    max_positions: int = 1024
    heldout_percent: int = 3  # files whose path hash falls below this percentage are held out
    max_files: int | None = None
    eval_batches: int = 8
    target: ModelSpec = ModelSpec(layers=8, hidden=256, heads=4, intermediate=768)
    small: ModelSpec = ModelSpec(layers=1, hidden=256, heads=4, intermediate=768)
    tiny: ModelSpec = ModelSpec(layers=1, hidden=64, heads=2, intermediate=192)
    target_stage: StageConfig = StageConfig(steps=1000, lr=2e-3, warmup=60, batch=8, log_every=25, eval_every=250)
    # A second target stage: fresh AdamW, weights rounded through bfloat16 first (so a run
    # resumed from the saved stage-1 checkpoint with --target-stage1 is the same
    # computation), a new cosine cycle. It took the held-out loss from 3.94 to 2.79.
    target_stage2: StageConfig = StageConfig(steps=2500, lr=1e-3, warmup=50, batch=8, log_every=25, eval_every=500)
    # An optional third target stage against greedy loops: sequence-level unlikelihood
    # fine-tuning (Welleck et al., ICLR 2020), alternated with ordinary next-token steps.
    # Off (steps=0) for the bundled target: --stage3-steps 600 or 1500 made greedy output
    # less repetitive token by token but not line by line, at a higher held-out loss
    # (docs/models.md has the numbers).
    target_stage3: UnlikelihoodConfig = UnlikelihoodConfig(
        steps=0, lr=1e-4, warmup=20, batch=8, prefix=64, continuation=96, ngram=4, log_every=25, eval_every=100
    )
    # And/or DITTO against line copying (--ditto-steps N), also off: 800 steps took greedy
    # repeated lines from 0.38 to 0.32 only, at +0.085 nats of held-out loss (docs/models.md).
    target_ditto: DittoConfig = DittoConfig(
        steps=0,
        lr=1e-4,
        warmup=20,
        batch=8,
        prefix=64,
        length=256,
        min_line=4,
        max_line=40,
        decay=0.5,
        log_every=25,
        eval_every=200,
    )
    small_stage: StageConfig = StageConfig(steps=1500, lr=2e-3, warmup=30, batch=8, log_every=25, eval_every=500)
    tiny_stage: StageConfig = StageConfig(steps=250, lr=4e-3, warmup=20, batch=8, log_every=25, eval_every=125)


FULL = TrainConfig()
SMOKE = TrainConfig(
    vocab_size=320,
    seq_len=64,
    max_positions=128,
    heldout_percent=20,
    max_files=12,
    eval_batches=2,
    target=ModelSpec(layers=2, hidden=32, heads=2, intermediate=64),
    small=ModelSpec(layers=1, hidden=32, heads=2, intermediate=64),
    tiny=ModelSpec(layers=1, hidden=16, heads=1, intermediate=32),
    target_stage=StageConfig(steps=6, lr=3e-3, warmup=2, batch=2, log_every=2, eval_every=3),
    target_stage2=StageConfig(steps=3, lr=2e-3, warmup=1, batch=2, log_every=2, eval_every=3),
    target_stage3=UnlikelihoodConfig(
        steps=4, lr=1e-4, warmup=1, batch=2, prefix=8, continuation=12, ngram=2, log_every=2, eval_every=2
    ),
    target_ditto=DittoConfig(
        steps=4,
        lr=1e-4,
        warmup=1,
        batch=2,
        prefix=8,
        length=40,
        min_line=2,
        max_line=12,
        decay=0.5,
        log_every=2,
        eval_every=2,
    ),
    small_stage=StageConfig(steps=4, lr=3e-3, warmup=1, batch=2, log_every=2, eval_every=2),
    tiny_stage=StageConfig(steps=3, lr=3e-3, warmup=1, batch=2, log_every=2, eval_every=3),
)


# ---------------------------------------------------------------------------- data


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def list_stdlib_files(root: Path) -> list[str]:
    """Sorted relative paths of the stdlib's .py files, minus tests and non-code data."""
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if any(part in EXCLUDE_DIRS for part in rel.parts[:-1]):
            continue
        if any(part.startswith(EXCLUDE_PREFIXES) for part in rel.parts):
            continue
        files.append(rel.as_posix())
    return sorted(files)


def is_heldout(rel: str, percent: int) -> bool:
    """Deterministic split by file: a hash of the relative path, not of the contents."""
    return int(hashlib.sha256(rel.encode()).hexdigest(), 16) % 100 < percent


def split_files(files: list[str], percent: int) -> tuple[list[str], list[str]]:
    train = [f for f in files if not is_heldout(f, percent)]
    held = [f for f in files if is_heldout(f, percent)]
    return train, held


def read_text(root: Path, rel: str) -> str:
    return (root / rel).read_text(encoding="utf-8", errors="replace")


def provenance(root: Path, files: list[str], train: list[str], held: list[str]) -> dict:
    listing = "\n".join(files).encode()
    content = hashlib.sha256()
    for rel in files:
        content.update(rel.encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return {
        "source": "CPython standard library (.py files)",
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "stdlib_path": str(root),
        "excluded_dirs": sorted(EXCLUDE_DIRS),
        "excluded_prefixes": list(EXCLUDE_PREFIXES),
        "n_files": len(files),
        "n_train_files": len(train),
        "n_heldout_files": len(held),
        "file_list_sha256": hashlib.sha256(listing).hexdigest(),
        "content_sha256": content.hexdigest(),
        "heldout_files": held,
        "licence": "PSF License Agreement (Python Software Foundation License Version 2); "
        "see LICENSE.txt in the stdlib folder",
    }


# ---------------------------------------------------------------------------- tokenizer


def train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE (GPT-2 style pre-tokenizer) with one special token, EOS."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS,
        bos_token=EOS,
        unk_token=EOS,
        pad_token=EOS,
        model_max_length=1024,
        clean_up_tokenization_spaces=False,
    )


def encode_corpus(tokenizer, texts: list[str]) -> np.ndarray:
    """One stream: file, EOS, file, EOS, ... as uint16 token ids."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for enc in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids.extend(enc)
        ids.append(eos)
    assert max(ids) < 65536, "token ids must fit uint16"
    return np.asarray(ids, dtype=np.uint16)


def sample_batch(data: np.ndarray, batch: int, seq_len: int, rng: np.random.Generator) -> torch.Tensor:
    starts = rng.integers(0, len(data) - seq_len - 1, size=batch)
    return torch.from_numpy(np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int64))


def eval_batches(data: np.ndarray, n: int, seq_len: int) -> list[torch.Tensor]:
    """Fixed, evenly spaced held-out windows (the same for every model)."""
    span = len(data) - seq_len - 1
    starts = np.linspace(0, span, num=n * 4, dtype=np.int64)
    windows = [data[s : s + seq_len + 1] for s in starts]
    return [torch.from_numpy(np.stack(windows[i : i + 4]).astype(np.int64)) for i in range(0, len(windows), 4)]


# ---------------------------------------------------------------------------- training


class Log:
    def __init__(self, path: Path, append: bool = False):
        self.path = path
        self.fh = path.open("a" if append else "w", encoding="utf-8")
        self.t0 = time.perf_counter()

    def __call__(self, msg: str) -> None:
        line = f"[{time.perf_counter() - self.t0:8.1f}s] {msg}"
        print(line, flush=True)
        self.fh.write(line + "\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def lr_at(step: int, stage: StageConfig) -> float:
    if step < stage.warmup:
        return stage.lr * (step + 1) / stage.warmup
    progress = (step - stage.warmup) / max(1, stage.steps - stage.warmup)
    return stage.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@functools.cache
def native_bfloat16() -> bool:
    """Whether oneDNN computes bfloat16 natively on this CPU (AVX-512 BF16, AMX); asked once."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def autocast():
    """bfloat16 autocast where the CPU computes in bfloat16; float32 elsewhere: without native
    support a bfloat16 matmul is emulated, and on this AVX2 machine a 1536 x 1728 by 1728 x 576
    linear took 321 ms in bfloat16 against 39 ms in float32 (1 thread)."""
    return torch.autocast("cpu", dtype=torch.bfloat16) if native_bfloat16() else contextlib.nullcontext()


def logits_of(model, x: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x, use_cache=False).logits.float()


def kl_to_teacher(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(p_teacher || q_student) at temperature 1."""
    log_q = F.log_softmax(student_logits, dim=-1)
    log_p = F.log_softmax(teacher_logits, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


@torch.no_grad()
def evaluate(model, batches: list[torch.Tensor], teacher=None) -> dict:
    """Held-out cross-entropy (nats/token); with a teacher also KL and alpha = E[sum min(p,q)]."""
    model.eval()
    ce, kl, alpha, n = 0.0, 0.0, 0.0, 0
    for b in batches:
        x, y = b[:, :-1], b[:, 1:]
        with autocast():
            logits = logits_of(model, x)
            t_logits = logits_of(teacher, x) if teacher is not None else None
        ce += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
        if t_logits is not None:
            q = F.softmax(logits, -1)
            p = F.softmax(t_logits, -1)
            kl += (p * (torch.log(p + 1e-30) - torch.log(q + 1e-30))).sum().item()
            alpha += torch.minimum(p, q).sum().item()
        n += y.numel()
    model.train()
    out = {"loss": ce / n, "ppl": math.exp(ce / n)}
    if teacher is not None:
        out["kl"] = kl / n
        out["alpha_teacher_forced"] = alpha / n
    return out


def train_stage(
    name: str,
    model,
    stage: StageConfig,
    cfg: TrainConfig,
    data: np.ndarray,
    held: list[torch.Tensor],
    log: Log,
    rng: np.random.Generator,
    teacher=None,
) -> dict:
    opt = torch.optim.AdamW(model.parameters(), lr=stage.lr, betas=(0.9, 0.95), weight_decay=0.1)
    n_params = sum(p.numel() for p in model.parameters())
    log(
        f"{name}: {n_params / 1e6:.2f}M parameters, {stage.steps} steps of {stage.batch}x{cfg.seq_len} tokens"
        + (" (distilled from the target, KL at temperature 1)" if teacher is not None else "")
    )
    model.train()
    started = time.perf_counter()
    running = None
    for step in range(stage.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, stage)
        b = sample_batch(data, stage.batch, cfg.seq_len, rng)
        x, y = b[:, :-1], b[:, 1:]
        with autocast():
            logits = logits_of(model, x)
            if teacher is not None:
                with torch.no_grad():
                    t_logits = logits_of(teacher, x)
        if teacher is None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        else:
            loss = kl_to_teacher(logits, t_logits)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = loss.item()
        running = value if running is None else 0.9 * running + 0.1 * value
        if (step + 1) % stage.log_every == 0 or step == 0:
            rate = (step + 1) * stage.batch * cfg.seq_len / (time.perf_counter() - started)
            kind = "kl" if teacher is not None else "loss"
            log(
                f"{name} step {step + 1}/{stage.steps} {kind} {value:.4f} (ema {running:.4f}) lr "
                f"{lr_at(step, stage):.2e} {rate:.0f} tok/s"
            )
        if (step + 1) % stage.eval_every == 0 and step + 1 < stage.steps:
            log(f"{name} eval step {step + 1}: {json.dumps(_round(evaluate(model, held, teacher)))}")
    final = evaluate(model, held, teacher)
    final["train_s"] = time.perf_counter() - started
    final["params"] = n_params
    log(f"{name} final: {json.dumps(_round(final))}")
    model.eval()
    return final


def repeat_mask(tokens: torch.Tensor, n: int) -> torch.Tensor:
    """1.0 on every token of an n-gram that already occurred earlier in the same row."""
    mask = torch.zeros(tokens.shape, dtype=torch.float32)
    for row, seq in enumerate(tokens.tolist()):
        seen: set[tuple[int, ...]] = set()
        for end in range(n, len(seq) + 1):
            gram = tuple(seq[end - n : end])
            if gram in seen:
                mask[row, end - n : end] = 1.0
            seen.add(gram)
    return mask


@torch.no_grad()
def greedy_continue(model, prefix: torch.Tensor, length: int) -> torch.Tensor:
    """`length` greedy tokens after each row of `prefix` (EOS suppressed, so rows stay aligned)."""
    was_training = model.training
    model.eval()
    with autocast():
        out = model.generate(
            input_ids=prefix,
            attention_mask=torch.ones_like(prefix),
            do_sample=False,
            max_new_tokens=length,
            min_new_tokens=length,
            pad_token_id=model.config.pad_token_id,
        )
    model.train(was_training)
    return out[:, prefix.shape[1] :]


def distinct_ngrams(tokens: torch.Tensor, n: int) -> float:
    """Mean over rows of unique n-grams / all n-grams (1.0 = no repeat, low = a loop)."""
    ratios = []
    for seq in tokens.tolist():
        grams = [tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)]
        ratios.append(len(set(grams)) / max(1, len(grams)))
    return float(np.mean(ratios))


def greedy_repetition(model, data: np.ndarray, stage: UnlikelihoodConfig, rows: int = 16) -> dict:
    """Distinct n-grams of greedy continuations after fixed held-out windows."""
    starts = np.linspace(0, len(data) - stage.prefix - 1, num=rows, dtype=np.int64)
    prefix = torch.from_numpy(np.stack([data[s : s + stage.prefix] for s in starts]).astype(np.int64))
    cont = greedy_continue(model, prefix, 2 * stage.continuation)
    return {f"greedy_distinct_{stage.ngram}grams": distinct_ngrams(cont, stage.ngram)}


def alternate_with_mle(
    name: str,
    model,
    schedule: StageConfig,
    cfg: TrainConfig,
    data: np.ndarray,
    log: Log,
    rng: np.random.Generator,
    measure,
    term: str,
    term_step,
) -> dict:
    """Fine-tuning that alternates ordinary next-token steps (even steps, `schedule.batch` x
    seq_len windows) with another loss (odd steps): `term_step()` returns that loss and any
    further scalars to log. The MLE steps keep the model close to the data."""
    opt = torch.optim.AdamW(model.parameters(), lr=schedule.lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    started = time.perf_counter()
    emas: dict[str, float] = {"mle": 0.0, term: 0.0}
    seen: set[str] = set()

    def track(key: str, value: float) -> None:
        emas[key] = value if key not in seen else 0.9 * emas[key] + 0.1 * value
        seen.add(key)

    for step in range(schedule.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, schedule)
        if step % 2 == 0:
            b = sample_batch(data, schedule.batch, cfg.seq_len, rng)
            with autocast():
                logits = logits_of(model, b[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1))
            track("mle", loss.item())
        else:
            loss, extra = term_step()
            track(term, loss.item())
            for key, value in extra.items():
                track(key, value)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % schedule.log_every == 0 or step < 2:
            log(
                f"{name} step {step + 1}/{schedule.steps} "
                + " ".join(f"{k} (ema) {v:.4f}" for k, v in emas.items())
                + f" lr {lr_at(step, schedule):.2e} {time.perf_counter() - started:.0f}s"
            )
        if (step + 1) % schedule.eval_every == 0 and step + 1 < schedule.steps:
            log(f"{name} eval step {step + 1}: {json.dumps(_round(measure()))}")
    final = measure()
    final["train_s"] = time.perf_counter() - started
    final["params"] = sum(p.numel() for p in model.parameters())
    log(f"{name} final: {json.dumps(_round(final))}")
    model.eval()
    return final


def train_unlikelihood(
    name: str,
    model,
    stage: UnlikelihoodConfig,
    cfg: TrainConfig,
    data: np.ndarray,
    held: list[torch.Tensor],
    held_ids: np.ndarray,
    log: Log,
    rng: np.random.Generator,
) -> dict:
    """Sequence-level unlikelihood fine-tuning (Welleck et al., 2020), alternating with MLE steps.

    The unlikelihood term is -log(1 - p(x_t)) on the model's own greedy tokens that belong to
    a repeated n-gram, averaged over all continuation tokens: it removes probability from the
    loop the model would fall into."""

    def measure() -> dict:
        return {**evaluate(model, held), **greedy_repetition(model, held_ids, stage)}

    def unlikelihood_step() -> tuple[torch.Tensor, dict]:
        prefix = sample_batch(data, stage.batch, stage.prefix - 1, rng)
        cont = greedy_continue(model, prefix, stage.continuation)
        mask = repeat_mask(cont, stage.ngram)
        with autocast():
            logits = logits_of(model, torch.cat([prefix, cont[:, :-1]], dim=1))
        probs = F.softmax(logits[:, stage.prefix - 1 :], dim=-1).gather(-1, cont.unsqueeze(-1)).squeeze(-1)
        loss = -(torch.log((1.0 - probs).clamp(min=1e-5)) * mask).sum() / mask.numel()
        return loss, {"repeated share of greedy tokens": mask.mean().item()}

    log(
        f"{name}: {stage.steps} steps alternating MLE ({stage.batch}x{cfg.seq_len}) and sequence unlikelihood "
        f"({stage.batch} x {stage.prefix}+{stage.continuation} greedy tokens, {stage.ngram}-gram repeats); "
        f"before: {json.dumps(_round(measure()))}"
    )
    schedule = StageConfig(stage.steps, stage.lr, stage.warmup, stage.batch, stage.log_every, stage.eval_every)
    return alternate_with_mle(name, model, schedule, cfg, data, log, rng, measure, "unlikelihood", unlikelihood_step)


def newline_token_ids(tokenizer) -> np.ndarray:
    """Boolean mask over the vocabulary: tokens whose text contains a line break."""
    return np.array(["\n" in tokenizer.decode([i]) for i in range(len(tokenizer))], dtype=bool)


def training_lines(data: np.ndarray, newline: np.ndarray, eos: int, stage: DittoConfig) -> np.ndarray:
    """(start, end) token spans of the lines of `data` usable as repeated lines: the tokens after
    one line-break token up to and including the next, min_line..max_line long, with at least
    `prefix` tokens before them and no EOS."""
    breaks = np.flatnonzero(newline[data])
    starts, ends = breaks[:-1] + 1, breaks[1:] + 1
    keep = (ends - starts >= stage.min_line) & (ends - starts <= stage.max_line) & (starts >= stage.prefix)
    spans = np.stack([starts[keep], ends[keep]], axis=1)
    has_eos = np.array([(data[a:b] == eos).any() for a, b in spans], dtype=bool) if len(spans) else np.zeros(0, bool)
    return spans[~has_eos]


def repetition_batch(
    data: np.ndarray, lines: np.ndarray, stage: DittoConfig, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows of `prefix` real tokens + one line repeated to `length` tokens; for each predicted
    position (index into the row minus 1) the position of the same token one repetition
    earlier (prev), and a mask of the positions in the second and later repetitions."""
    rows, prev, mask = (
        [],
        np.zeros((stage.batch, stage.length - 1), np.int64),
        np.zeros((stage.batch, stage.length - 1), np.float32),
    )
    for r, (a, b) in enumerate(lines[rng.integers(0, len(lines), size=stage.batch)]):
        line = data[a:b].astype(np.int64)
        reps = -(-(stage.length - stage.prefix) // len(line))
        rows.append(np.concatenate([data[a - stage.prefix : a].astype(np.int64), np.tile(line, reps)])[: stage.length])
        # the prediction of row[t] sits at logits index t - 1; its copy one line earlier at t - 1 - len(line)
        t = np.arange(stage.prefix + len(line), stage.length)
        prev[r, t - 1] = t - 1 - len(line)
        mask[r, t - 1] = 1.0
    return torch.from_numpy(np.stack(rows)), torch.from_numpy(prev), torch.from_numpy(mask)


def train_ditto(
    name: str,
    model,
    stage: DittoConfig,
    cfg: TrainConfig,
    data: np.ndarray,
    held: list[torch.Tensor],
    held_ids: np.ndarray,
    newline: np.ndarray,
    eos: int,
    log: Log,
    rng: np.random.Generator,
) -> dict:
    """DITTO (Xu et al., 2022), alternating with MLE steps: on a repeated line the loss is
    -log(1 - |p_n(x) - decay * p_(n-1)(x)|), p_(n-1) the (constant) probability of the same
    token one repetition earlier."""

    def measure() -> dict:  # the unlikelihood stage's loop measure, for comparison
        return {**evaluate(model, held), **greedy_repetition(model, held_ids, cfg.target_stage3)}

    lines = training_lines(data, newline, eos, stage)

    def ditto_step() -> tuple[torch.Tensor, dict]:
        x, prev, mask = repetition_batch(data, lines, stage, rng)
        with autocast():
            logits = logits_of(model, x[:, :-1])
        probs = F.softmax(logits, dim=-1).gather(-1, x[:, 1:].unsqueeze(-1)).squeeze(-1)
        gap = (probs - stage.decay * probs.detach().gather(1, prev)).abs()
        return -(torch.log((1.0 - gap).clamp(min=1e-5)) * mask).sum() / mask.sum(), {}

    log(
        f"{name}: {stage.steps} steps alternating MLE ({stage.batch}x{cfg.seq_len}) and DITTO ({stage.batch} x "
        f"{stage.prefix} tokens + a line of {stage.min_line}-{stage.max_line} tokens repeated to {stage.length}, "
        f"decay {stage.decay}; {len(lines)} lines); before: {json.dumps(_round(measure()))}"
    )
    schedule = StageConfig(stage.steps, stage.lr, stage.warmup, stage.batch, stage.log_every, stage.eval_every)
    return alternate_with_mle(name, model, schedule, cfg, data, log, rng, measure, "ditto", ditto_step)


def _round(d: dict) -> dict:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}


def init_draft_from_target(draft, target, layer_map: list[int]) -> None:
    """Copy embeddings, final norm and chosen layers (same width) from the target."""
    with torch.no_grad():  # tracked copies (a kernel layer's bfloat16 halves follow the version)
        draft.model.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        draft.model.norm.weight.copy_(target.model.norm.weight)
    for i, j in enumerate(layer_map):
        draft.model.layers[i].load_state_dict(target.model.layers[j].state_dict())


def save_model(model, path: Path, name: str) -> None:
    """bfloat16 safetensors (half the bytes); loading upcasts to float32."""
    from copy import deepcopy

    m = deepcopy(model).to(torch.bfloat16)
    m.config._name_or_path = f"specscope/{name}"
    m.generation_config.pad_token_id = model.config.pad_token_id
    m.save_pretrained(path, safe_serialization=True)


# ---------------------------------------------------------------------------- main


def write_data_md(path: Path, prov: dict, cfg_name: str) -> None:
    lines = [
        "# Training data of the bundled models",
        "",
        "The bundled tokenizer and models (`resources/models/`) were trained by",
        f"`training/train_models.py` ({cfg_name} configuration) on the Python source of the CPython",
        "standard library of the interpreter that ran the script. Nothing was downloaded.",
        "",
        "| field | value |",
        "|---|---|",
        f"| source | {prov['source']} |",
        f"| Python | {prov['python_implementation']} {prov['python_version']} |",
        f"| stdlib folder | `{prov['stdlib_path']}` |",
        f"| excluded folders | {', '.join('`' + d + '/`' for d in prov['excluded_dirs'])} |",
        f"| excluded name prefixes | {', '.join('`' + p + '`' for p in prov['excluded_prefixes'])} |",
        f"| files | {prov['n_files']} ({prov['n_train_files']} training, {prov['n_heldout_files']} held out) |",
        f"| sha256 of the sorted file list (relative paths joined by newlines) | `{prov['file_list_sha256']}` |",
        f"| sha256 of the contents (path, NUL, bytes, NUL for each file in order) | `{prov['content_sha256']}` |",
        f"| licence | {prov['licence']} |",
        "",
        "The split is by file: a file is held out when `int(sha256(relative_path), 16) % 100` is below",
        "the held-out percentage, so no held-out file contributes any training token.",
        "`scripts/measure_models.py` takes its held-out prompts from these files only.",
        "",
        "## Licence",
        "",
        "The CPython standard library is Copyright (c) 2001-2023 Python Software Foundation and is",
        "distributed under the PSF License Agreement (the full text ships with every Python as",
        "`LICENSE.txt` in the stdlib folder). The model weights are derived from it; the licence",
        "permits derivative works provided the PSF copyright notice is retained, which this file does.",
        "",
        "## Held-out files",
        "",
    ]
    lines += [f"- `{f}`" for f in prov["heldout_files"]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "resources" / "models")
    ap.add_argument("--smoke", action="store_true", help="a few steps on a few files (seconds)")
    ap.add_argument("--stdlib", type=Path, default=None, help="stdlib folder (default: this interpreter's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reuse-target", action="store_true", help="load tokenizer + target from --out, train drafts only")
    ap.add_argument(
        "--target-stage1",
        type=Path,
        default=None,
        help="resume: load this stage-1 target checkpoint (tokenizer from --out) instead of training stage 1",
    )
    ap.add_argument(
        "--target-stage2",
        type=Path,
        default=None,
        help="resume: load this stage-2 target checkpoint (tokenizer from --out) and run only stage 3",
    )
    ap.add_argument(
        "--stage3-steps",
        type=int,
        default=None,
        help="steps of the optional unlikelihood stage (full runs: 0, off; 600 and 1500 were tried)",
    )
    ap.add_argument(
        "--ditto-steps",
        type=int,
        default=None,
        help="steps of the optional DITTO stage against line copying (full runs: 0, off)",
    )
    ap.add_argument(
        "--target-only", action="store_true", help="stop after saving the target (for experiments with its stages)"
    )
    ap.add_argument(
        "--keep-stage1",
        action="store_true",
        help="keep the intermediate target checkpoints (out/target-stage1, out/target-stage2)",
    )
    ap.add_argument("--no-data-md", action="store_true", help="do not write DATA.md next to --out")
    args = ap.parse_args(argv)

    from transformers import AutoTokenizer, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    cfg = SMOKE if args.smoke else FULL
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    if args.stage3_steps is not None:
        cfg = dataclasses.replace(cfg, target_stage3=dataclasses.replace(cfg.target_stage3, steps=args.stage3_steps))
    if args.ditto_steps is not None:
        cfg = dataclasses.replace(cfg, target_ditto=dataclasses.replace(cfg.target_ditto, steps=args.ditto_steps))
    resuming = args.reuse_target or args.target_stage1 is not None or args.target_stage2 is not None
    log = Log(out / "train_log.txt", append=resuming)
    t_start = time.perf_counter()
    log(
        f"specscope training ({'smoke' if args.smoke else 'full'}): python {platform.python_version()}, torch "
        f"{torch.__version__}, "
        f"threads {args.threads}, seed {cfg.seed}"
    )

    root = args.stdlib or stdlib_root()
    files = list_stdlib_files(root)
    if cfg.max_files:
        files = files[:: max(1, len(files) // cfg.max_files)][: cfg.max_files]
    train_files, held_files = split_files(files, cfg.heldout_percent)
    if not held_files:  # tiny smoke subsets: hold out the last file
        train_files, held_files = train_files[:-1], train_files[-1:]
    prov = provenance(root, files, train_files, held_files)
    log(
        f"data: {len(files)} files from {root} ({len(train_files)} train, {len(held_files)} held out), "
        f"file list sha256 {prov['file_list_sha256'][:16]}"
    )
    order = rng.permutation(len(train_files))
    train_texts = [read_text(root, train_files[i]) for i in order]
    held_texts = [read_text(root, f) for f in held_files]

    if resuming:
        tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer", local_files_only=True)
    else:
        t0 = time.perf_counter()
        tokenizer = train_tokenizer(train_texts, cfg.vocab_size)
        tokenizer.save_pretrained(out / "tokenizer")
        log(
            f"tokenizer: vocab {len(tokenizer)}, eos {tokenizer.eos_token!r}={tokenizer.eos_token_id}, "
            f"{time.perf_counter() - t0:.1f}s"
        )
    train_ids = encode_corpus(tokenizer, train_texts)
    held_ids = encode_corpus(tokenizer, held_texts)
    n_bytes = sum(len(t.encode()) for t in train_texts)
    log(f"tokens: {len(train_ids)} train ({n_bytes / len(train_ids):.2f} bytes/token), {len(held_ids)} held out")
    held = eval_batches(held_ids, cfg.eval_batches, cfg.seq_len)
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    metrics: dict = {}

    # 1. target
    if args.reuse_target:
        target = LlamaForCausalLM.from_pretrained(out / "target", dtype=torch.float32, local_files_only=True)
        metrics["target"] = evaluate(target, held)
        lines = (out / "train_log.txt").read_text(encoding="utf-8").splitlines()
        spent = 0.0
        for marker in (
            "target final: ",
            "target stage 2 final: ",
            "target stage 3 final: ",
            "target DITTO final: ",
        ):  # training time of the run(s) that made it
            found = [line for line in lines if marker in line]
            if found:
                spent += json.loads(found[-1].split(marker, 1)[1]).get("train_s") or 0.0
        metrics["target"]["train_s"] = spent or None
        log(f"target reused: {json.dumps(_round(metrics['target']))}")
    else:
        if args.target_stage2 is not None:
            target = LlamaForCausalLM.from_pretrained(args.target_stage2, dtype=torch.float32, local_files_only=True)
            metrics["target_stage2"] = evaluate(target, held)
            log(f"target stage 2 loaded from {args.target_stage2}: {json.dumps(_round(metrics['target_stage2']))}")
        else:
            if args.target_stage1 is not None:
                target = LlamaForCausalLM.from_pretrained(
                    args.target_stage1, dtype=torch.float32, local_files_only=True
                )
                log(f"target stage 1 loaded from {args.target_stage1}: {json.dumps(_round(evaluate(target, held)))}")
            else:
                torch.manual_seed(cfg.seed)
                target = LlamaForCausalLM(cfg.target.config(vocab, eos, cfg.max_positions))
                metrics["target_stage1"] = train_stage(
                    "target", target, cfg.target_stage, cfg, train_ids, held, log, rng
                )
                save_model(target, out / "target-stage1", "target-stage1")
            if cfg.target_stage2.steps:
                target = target.to(torch.bfloat16).to(torch.float32)  # the same start as a resumed run
                metrics["target_stage2"] = train_stage(
                    "target stage 2",
                    target,
                    cfg.target_stage2,
                    cfg,
                    train_ids,
                    held,
                    log,
                    np.random.default_rng([cfg.seed, 3]),
                )
                save_model(target, out / "target-stage2", "target-stage2")
        if cfg.target_stage3.steps:
            target = target.to(torch.bfloat16).to(torch.float32)  # the same start as a resumed run
            torch.manual_seed(cfg.seed + 3)
            metrics["target"] = train_unlikelihood(
                "target stage 3",
                target,
                cfg.target_stage3,
                cfg,
                train_ids,
                held,
                held_ids,
                log,
                np.random.default_rng([cfg.seed, 4]),
            )
        if cfg.target_ditto.steps:
            target = target.to(torch.bfloat16).to(torch.float32)  # the same start as a resumed run
            torch.manual_seed(cfg.seed + 5)
            metrics["target"] = train_ditto(
                "target DITTO",
                target,
                cfg.target_ditto,
                cfg,
                train_ids,
                held,
                held_ids,
                newline_token_ids(tokenizer),
                eos,
                log,
                np.random.default_rng([cfg.seed, 5]),
            )
        if not (cfg.target_stage3.steps or cfg.target_ditto.steps):
            metrics["target"] = metrics.get("target_stage2") or metrics.get("target_stage1") or evaluate(target, held)
        save_model(target, out / "target", "target")
        tokenizer.save_pretrained(out / "target")
        if args.target_only:
            log(f"target only: done in {(time.perf_counter() - t_start) / 60:.1f} min")
            log.close()
            return {"metrics": {k: _round(v) for k, v in metrics.items()}}
    # The drafts learn from the target as it is stored (bfloat16 weights, computed in float32),
    # which is also what --reuse-target loads, so both paths distil from the same teacher.
    target = target.to(torch.bfloat16).to(torch.float32)
    for p in target.parameters():
        p.requires_grad_(False)
    target.eval()

    # 2. draft-small: same width as the target, initialised from its embeddings and two layers
    torch.manual_seed(cfg.seed + 1)
    small = LlamaForCausalLM(cfg.small.config(vocab, eos, cfg.max_positions))
    if cfg.small.hidden == cfg.target.hidden and cfg.small.intermediate == cfg.target.intermediate:
        init_draft_from_target(small, target, [0, cfg.target.layers - 1][: cfg.small.layers])
        log(f"draft-small initialised from target layers {[0, cfg.target.layers - 1][: cfg.small.layers]}")
    # Each draft stage has its own data stream, so --reuse-target reproduces a full run's drafts.
    metrics["draft-small"] = train_stage(
        "draft-small",
        small,
        cfg.small_stage,
        cfg,
        train_ids,
        held,
        log,
        np.random.default_rng([cfg.seed, 1]),
        teacher=target,
    )
    save_model(small, out / "draft-small", "draft-small")
    tokenizer.save_pretrained(out / "draft-small")

    # 3. draft-tiny: random init, narrow, a short distillation
    torch.manual_seed(cfg.seed + 2)
    tiny = LlamaForCausalLM(cfg.tiny.config(vocab, eos, cfg.max_positions))
    metrics["draft-tiny"] = train_stage(
        "draft-tiny",
        tiny,
        cfg.tiny_stage,
        cfg,
        train_ids,
        held,
        log,
        np.random.default_rng([cfg.seed, 2]),
        teacher=target,
    )
    save_model(tiny, out / "draft-tiny", "draft-tiny")
    tokenizer.save_pretrained(out / "draft-tiny")

    total = time.perf_counter() - t_start
    if not args.keep_stage1:  # intermediate checkpoints, for resuming only
        for stage_dir in ("target-stage1", "target-stage2"):
            if (out / stage_dir).is_dir():
                shutil.rmtree(out / stage_dir)
    weight_bytes = sum(
        (out / name / "model.safetensors").stat().st_size for name in ("target", "draft-small", "draft-tiny")
    )
    log(f"done in {total / 60:.1f} min; weights {weight_bytes / 1e6:.2f} MB")
    summary = {
        "mode": "smoke" if args.smoke else "full",
        "config": dataclasses.asdict(cfg),
        "data": {k: v for k, v in prov.items() if k != "heldout_files"},
        "heldout_files": held_files,
        "tokens": {"train": len(train_ids), "heldout": len(held_ids)},
        "metrics": {k: _round(v) for k, v in metrics.items()},
        "total_s": round(total, 1),
        "weight_bytes": weight_bytes,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "tokenizers": __import__("tokenizers").__version__,
        },
        "threads": args.threads,
    }
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    if not args.no_data_md:
        write_data_md(out.parent / "DATA.md", prov, summary["mode"])
    log.close()
    return summary


if __name__ == "__main__":
    main()

"""Train an EAGLE-3 draft head on a local target's hidden states (issue 30).

Data (offline): windows of the CPython standard library's .py files, split by file exactly
as training/train_models.py splits them (the bundled target never saw the held-out files),
and the target's own continuations of prompts cut from the same files, greedy and sampled
at temperature 1. One pass of the target over every sequence caches what training needs:
the chosen layers' features (bfloat16) and the target's top-K next-token log-probabilities;
the target is not run again while the head trains.

The head is core/draft/heads/eagle3.py's module, trained as it serves: three layers' features
concatenated and fused by `fc`, one decoder layer over [norm(embedding); norm(feature)], its
own norm and lm_head over a reduced draft vocabulary (the target ids with the most
probability mass under the target's own next-token distributions on the training data; d2t,
t2d). The target's embedding is shared and frozen; lm_head and norm start from the target's.

Training-time test (EAGLE-3): each step unrolls the head `depth` times. Depth 0 reads the
target's features at every position; depth s reads the head's own output of depth s - 1 and
the next token, at rotary position j + s, attending to the depth-0 entries up to its anchor j
and to its own chain's deeper entries: exactly what the serving proposer computes when it
drafts s tokens past the committed context. The loss at depth s is KL(p || q) between the
target's distribution at position j + s + 1 and the head's, coarsened to the target's top-K
tokens inside the draft vocabulary plus one bucket for the rest, weighted `decay`**s.

Held-out measures, written into the head's config.json ("specscope" block): per depth s, the
fraction of positions where the head's argmax equals the target's (given correct inputs up
to s), on held-out text and on held-out greedy and sampled generations; and the expected
accepted length of a greedy chain of `depth` drafts on the held-out greedy generations
(1 + the mean run of correct depths), which is what greedy speculative decoding accepts.

    nice -n 10 python training/train_head.py --minutes 26            # the bundled target's head
    python training/train_head.py --smoke --out /tmp/head             # about a minute
    python training/train_head.py --target PATH --out PATH --layers 2,10,21

A chat target (its tokenizer has a chat template; `--target smollm2` names the fetched one)
trains on chat data instead: its own answers under its chat template to the training prompts
of training/smollm2_prompts.py (the SmolLM2 draft's hash split: held-out and bundled prompts
never train), greedy and sampled at T = 1, plus windows of stdlib training files and of the
Python documentation sources (a documentation file holding a held-out summary's paragraph is
left out). Its held-out sets: greedy answers per prompt kind (greedy-chat, greedy-summary,
greedy-code, each with its expected accepted length), sampled answers and stdlib text.
Sampled answers train_smollm2_draft.py cached may be reused (--reuse-answers). The recipe of
resources/models/eagle3-smollm2 is in docs/models.md ("The SmolLM2 head").

Output (--out, default resources/models/eagle3-target): config.json and model.safetensors
in the EAGLE-3 format core/draft/heads/eagle3.py reads (bfloat16 weights; d2t int64, t2d
bool), train_log.txt and training.json.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_models as tm

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Config:
    seed: int = 1234
    layers: tuple[int, ...] | None = None  # target hidden-state indices; None: (2, L // 2, L - 1)
    draft_vocab: int = 3072
    intermediate: int | None = None  # the head's MLP width; None: the target's
    heldout_percent: int = 3  # train_models.py's split: the bundled target's held-out files
    max_files: int | None = None  # every n-th stdlib file only (smoke runs)
    seq_len: int = 256
    text_windows: int = 768  # training windows of seq_len tokens
    heldout_text_windows: int = 48
    gen_prompt_len: int = 64  # generations: prompt + continuation = seq_len tokens
    gen_prompts: int = 384  # training continuations, half greedy, half sampled at T = 1
    heldout_gen_prompts: int = 48
    gen_batch: int = 32
    top_k: int = 16  # target tokens kept per position (plus a rest bucket)
    depth: int = 4  # training-time-test unroll
    decay: float = 0.8  # loss weight of depth s: decay ** s
    batch: int = 8
    steps: int = 20_000  # in practice --minutes ends training
    lr: float = 3e-3
    warmup: int = 50
    log_every: int = 25
    eval_every: int = 250
    threads: int = 1
    # chat targets (a tokenizer with a chat template) train on answers instead of continuations:
    answer_prompts: int = 512  # training prompts of training/smollm2_prompts.py, alternately greedy and T = 1
    answer_max_new: int = 160
    heldout_answer_prompts: int = 8  # per kind (chat, summary, code), answered greedily; as many sampled in all
    text_files: int = 400  # stdlib and documentation files tokenized for a chat target's text windows


SMOKE = replace(
    Config(),
    max_files=80,
    draft_vocab=1024,
    seq_len=64,
    text_windows=48,
    heldout_text_windows=4,
    gen_prompt_len=16,
    gen_prompts=8,
    heldout_gen_prompts=4,
    gen_batch=8,
    depth=3,
    batch=4,
    steps=40,
    warmup=5,
    log_every=10,
    eval_every=20,
    answer_prompts=6,
    answer_max_new=12,
    heldout_answer_prompts=1,
    text_files=12,
)
# A chat target's defaults: fewer text windows (its answers are the data), a wider draft vocabulary
# (49,152-token vocabularies spread their mass), smaller generation batches (a 30-layer target).
CHAT = replace(Config(), draft_vocab=8192, text_windows=128, heldout_text_windows=16, gen_batch=16, batch=6)
CHAT_SMOKE = replace(SMOKE, text_windows=6, heldout_text_windows=2, gen_batch=4)


# ---------------------------------------------------------------------------- the cache


@dataclass
class Cached:
    """Sequences with what training reads: tokens (N, T), features (N, T, 3, H) bfloat16, the
    target's top-K ids (N, T, K) int16 (int32 above 32,768 ids) and log-probabilities float16, `valid` (N, T): the
    positions whose next-token distribution is a label (a generation's positions after its
    EOS are padding), and `first` (N,): the first position whose next token was generated
    (0 for text)."""

    tokens: torch.Tensor
    features: torch.Tensor
    top_ids: torch.Tensor
    top_logp: torch.Tensor
    valid: torch.Tensor
    first: torch.Tensor

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def rows(self, index) -> Cached:
        return Cached(
            *(t[index] for t in (self.tokens, self.features, self.top_ids, self.top_logp, self.valid, self.first))
        )

    @staticmethod
    def join(parts: list[Cached]) -> Cached:
        return Cached(
            *(
                torch.cat(ts)
                for ts in zip(*((p.tokens, p.features, p.top_ids, p.top_logp, p.valid, p.first) for p in parts))
            )
        )


@torch.no_grad()
def cache_sequences(
    target,
    layers: tuple[int, ...],
    tokens: torch.Tensor,
    valid: torch.Tensor,
    first: torch.Tensor,
    top_k: int,
    batch: int,
    log=None,
) -> Cached:
    """One float32 forward of the target per batch of sequences: features and top-K."""
    feats, ids, logps = [], [], []
    t0 = time.perf_counter()
    for b in range(0, len(tokens), batch):
        if log is not None and b and (b // batch) % 8 == 0:
            log(f"  {b}/{len(tokens)} sequences through the target, {time.perf_counter() - t0:.0f}s")
        out = target(input_ids=tokens[b : b + batch], output_hidden_states=True, use_cache=False)
        feats.append(torch.stack([out.hidden_states[i] for i in layers], dim=2).to(torch.bfloat16))
        v, i = F.log_softmax(out.logits.float(), dim=-1).topk(top_k, dim=-1)
        ids.append(i.to(top_id_dtype(out.logits.shape[-1])))
        logps.append(v.to(torch.float16))
    return Cached(tokens, torch.cat(feats), torch.cat(ids), torch.cat(logps), valid, first)


def top_id_dtype(vocab: int) -> torch.dtype:
    """int16 holds ids below 32,768 (the bundled target's 4,096); a larger vocabulary needs int32."""
    return torch.int16 if vocab <= torch.iinfo(torch.int16).max + 1 else torch.int32


def text_windows(stream: np.ndarray, n: int, seq_len: int, rng: np.random.Generator | None) -> torch.Tensor:
    """n windows of the token stream: random starts, or evenly spaced ones without an rng."""
    span = len(stream) - seq_len
    starts = rng.integers(0, span, size=n) if rng is not None else np.linspace(0, span, num=n, dtype=np.int64)
    return torch.from_numpy(np.stack([stream[s : s + seq_len] for s in starts]).astype(np.int64))


@torch.no_grad()
def generate(
    target, prompts: torch.Tensor, new: int, sample: bool, eos: int, batch: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's continuations of equal-length prompts (no padding needed): (tokens, valid).
    A continuation that emits EOS ends there: later positions are padding, not labels."""
    from transformers import GenerationConfig

    pure = {"temperature": 1.0, "top_k": 0, "top_p": 1.0} if sample else {}  # T = 1, nothing cut (None means 50)
    gen = GenerationConfig(do_sample=sample, max_new_tokens=new, eos_token_id=eos, pad_token_id=eos, **pure)
    width = prompts.shape[1]
    tokens = torch.full((len(prompts), width + new), eos, dtype=torch.long)
    for b in range(0, len(prompts), batch):
        rows = target.generate(
            input_ids=prompts[b : b + batch],
            attention_mask=torch.ones_like(prompts[b : b + batch]),
            generation_config=gen,
        )
        tokens[b : b + len(rows), : rows.shape[1]] = rows  # a batch that all ended early is shorter: EOS-padded
    valid = torch.ones_like(tokens, dtype=torch.bool)
    for r in range(len(tokens)):
        ends = (tokens[r, width:] == eos).nonzero()
        if len(ends):  # the EOS position itself is no label (nothing follows EOS in a run)
            valid[r, width + int(ends[0]) :] = False
    return tokens, valid


def build_cache(target, tok, cfg: Config, layers: tuple[int, ...], log) -> tuple[Cached, dict[str, Cached], dict]:
    """Training sequences (text and generations, shuffled) and the held-out sets by name."""
    root = tm.stdlib_root()
    files = tm.list_stdlib_files(root)
    if cfg.max_files:
        files = files[:: max(1, len(files) // cfg.max_files)][: cfg.max_files]
    train_files, held_files = tm.split_files(files, cfg.heldout_percent)
    if not held_files:  # a small subset: hold out its last file
        train_files, held_files = train_files[:-1], train_files[-1:]
    rng = np.random.default_rng(cfg.seed)
    train_ids = tm.encode_corpus(tok, [tm.read_text(root, f) for f in train_files])
    held_ids = tm.encode_corpus(tok, [tm.read_text(root, f) for f in held_files])
    log(
        f"data: {len(train_files)} training files ({len(train_ids)} tokens), {len(held_files)} held-out files "
        f"({len(held_ids)} tokens) from {root}"
    )
    eos = tok.eos_token_id
    new = cfg.seq_len - cfg.gen_prompt_len

    def text(stream, n, random):
        t0 = time.perf_counter()
        tokens = text_windows(stream, n, cfg.seq_len, rng if random else None)
        ones = torch.ones_like(tokens, dtype=torch.bool)
        out = cache_sequences(
            target, layers, tokens, ones, torch.zeros(n, dtype=torch.long), cfg.top_k, cfg.gen_batch, log
        )
        log(f"cached {n} text windows ({n * cfg.seq_len} tokens) in {time.perf_counter() - t0:.0f}s")
        return out

    def continuations(stream, n, sample, random):
        t0 = time.perf_counter()
        prompts = text_windows(stream, n, cfg.gen_prompt_len, rng if random else None)
        tokens, valid = generate(target, prompts, new, sample, eos, cfg.gen_batch)
        first = torch.full((n,), cfg.gen_prompt_len - 1, dtype=torch.long)
        out = cache_sequences(target, layers, tokens, valid, first, cfg.top_k, cfg.gen_batch)
        log(
            f"cached {n} {'sampled' if sample else 'greedy'} continuations "
            f"({int(valid[:, cfg.gen_prompt_len :].sum())} "
            f"generated tokens before EOS) in {time.perf_counter() - t0:.0f}s"
        )
        return out

    half, held_half = cfg.gen_prompts // 2, cfg.heldout_gen_prompts // 2
    train = Cached.join(
        [
            text(train_ids, cfg.text_windows, True),
            continuations(train_ids, half, False, True),
            continuations(train_ids, cfg.gen_prompts - half, True, True),
        ]
    )
    train = train.rows(torch.from_numpy(rng.permutation(len(train))))
    held = {
        "text": text(held_ids, cfg.heldout_text_windows, False),
        "greedy": continuations(held_ids, held_half, False, False),
        "sampled": continuations(held_ids, cfg.heldout_gen_prompts - held_half, True, False),
    }
    prov = {
        "source": "CPython standard library (.py files), train_models.py's split",
        "stdlib_path": str(root),
        "python_version": platform.python_version(),
        "heldout_percent": cfg.heldout_percent,
        "train_files": len(train_files),
        "heldout_files": len(held_files),
        "file_list_sha256": tm.provenance(root, files, train_files, held_files)["file_list_sha256"],
    }
    return train, held, prov


@torch.no_grad()
def cache_answers(
    target,
    layers: tuple[int, ...],
    rows: list[tuple[list[int], list[int]]],
    eos: int,
    seq_len: int,
    top_k: int,
    batch: int,
) -> Cached:
    """Chat sequences (prompt ids, answer ids) cached like cache_sequences: one float32 forward
    over each whole sequence (right-padded: padding is read by nothing before it), of which the
    last seq_len positions are kept (a long prompt loses its start, never the answer). Only the
    answer's positions are labels (`valid`): not the prompt's, not the answer's closing turn end,
    not padding; `first` is the prompt's last position."""
    full = [p + a for p, a in rows]
    order = sorted(range(len(full)), key=lambda r: len(full[r]))
    tokens = torch.full((len(full), seq_len), eos, dtype=torch.long)
    valid = torch.zeros(len(full), seq_len, dtype=torch.bool)
    first = torch.zeros(len(full), dtype=torch.long)
    feats = top_ids = top_logp = None
    for b in range(0, len(order), batch):
        chunk = order[b : b + batch]
        width = max(len(full[r]) for r in chunk)
        x = torch.full((len(chunk), width), eos, dtype=torch.long)
        for i, r in enumerate(chunk):
            x[i, : len(full[r])] = torch.tensor(full[r])
        out = target(input_ids=x, output_hidden_states=True, use_cache=False)
        f = torch.stack([out.hidden_states[i] for i in layers], dim=2).to(torch.bfloat16)
        v, ids = F.log_softmax(out.logits.float(), dim=-1).topk(top_k, dim=-1)
        if feats is None:
            feats = torch.zeros(len(full), seq_len, *f.shape[2:], dtype=torch.bfloat16)
            top_ids = torch.zeros(len(full), seq_len, top_k, dtype=top_id_dtype(out.logits.shape[-1]))
            top_logp = torch.zeros(len(full), seq_len, top_k, dtype=torch.float16)
        for i, r in enumerate(chunk):
            prompt, answer = rows[r]
            start = max(0, len(full[r]) - seq_len)
            n = len(full[r]) - start
            tokens[r, :n] = x[i, start : start + n]
            feats[r, :n] = f[i, start : start + n]
            top_ids[r, :n] = ids[i, start : start + n].to(top_ids.dtype)
            top_logp[r, :n] = v[i, start : start + n].to(torch.float16)
            first[r] = max(0, len(prompt) - 1 - start)
            # Labels are the answer's distributions the head drafts in serving: from the position
            # of the answer's first token (the prefill's bonus; the head's first draft predicts the
            # token after it) on. The prompt's positions (the template, a fixed system turn) are
            # read as context, never labels: the head never drafts them, and counting them made
            # the held-out chat accuracy .32 where the answers alone measure about .13.
            valid[r, first[r] + 1 : n - (1 if answer and answer[-1] == eos else 0)] = True
    return Cached(tokens, feats, top_ids, top_logp, valid, first)


def chat_text_stream(
    tok, cfg: Config, files: list[str], root: Path, held_summaries: list[str], rng: np.random.Generator
) -> tuple[np.ndarray, dict]:
    """A token stream of stdlib training files and Python documentation sources, half each (up to
    cfg.text_files files); a documentation file holding a held-out summary prompt's paragraph is left out."""
    import smollm2_prompts as prompts_mod

    docs = prompts_mod.docs_root()
    doc_files = []
    for f in sorted(docs.rglob("*.rst.txt")) if docs else []:
        plain = prompts_mod.rst_to_text(f.read_text(encoding="utf-8", errors="replace"))
        if not any(p in plain for p in held_summaries):
            doc_files.append(f)
    half = cfg.text_files // 2 if doc_files else cfg.text_files
    stdlib = [files[i] for i in sorted(rng.choice(len(files), size=min(len(files), half), replace=False))]
    picked = [doc_files[i] for i in sorted(rng.choice(len(doc_files), size=min(len(doc_files), half), replace=False))]
    texts = [tm.read_text(root, f) for f in stdlib] + [f.read_text(encoding="utf-8", errors="replace") for f in picked]
    prov = {
        "stdlib_files": len(stdlib),
        "docs_files": len(picked),
        "docs_path": str(docs),
        "docs_files_left_out_for_heldout_summaries": None
        if docs is None
        else len(sorted(docs.rglob("*.rst.txt"))) - len(doc_files),
    }
    return tm.encode_corpus(tok, texts), prov


def reused_answers(files: list[Path], allowed: set[tuple[int, ...]], what: str) -> list[dict]:
    """Answers cached by training/train_smollm2_draft.py (its --work files: the target's answers
    sampled at T = 1, with the prompt ids), kept only where the prompt is one of `allowed` (the
    encoded training prompts for training, the held-out ones for measuring): a file of the
    other split is refused."""
    rows = [r for f in files for r in torch.load(f, weights_only=False)]
    foreign = [r for r in rows if tuple(r["prompt"]) not in allowed]
    if foreign:
        raise SystemExit(
            f"train_head: {len(foreign)} of {len(rows)} reused answers in {', '.join(map(str, files))} "
            f"answer prompts outside the {what} split: refused"
        )
    return rows


def build_chat_cache(
    target, tok, cfg: Config, layers: tuple[int, ...], log, reuse: list[Path] = (), reuse_heldout: list[Path] = ()
) -> tuple[Cached, dict[str, Cached], dict]:
    """A chat target's training sequences: its own answers (greedy and sampled at T = 1, alternately)
    to the training prompts of training/smollm2_prompts.py under its chat template, and text
    windows; held out: greedy answers per prompt kind, sampled answers and stdlib text. Sampled
    answers cached by train_smollm2_draft.py may be reused (`reuse`, `reuse_heldout`): then the
    fresh prompts (others than theirs) are all answered greedily."""
    import smollm2_prompts as prompts_mod
    import train_smollm2_draft as sd

    from specscope.core.loading.chat import chat_prompt_ids, turn_end_id

    percent = sd.Config().heldout_percent  # the SmolLM2 draft's split: the same prompts stay held out
    docs = prompts_mod.docs_root()
    train_p, held_p = prompts_mod.split_prompts(prompts_mod.build_prompts(docs), percent)
    encode = {"train": {}, "held": {}}
    for split, prompts in (("train", train_p), ("held", held_p)):
        for p in prompts:
            encode[split][tuple(chat_prompt_ids(tok, p["user"], p.get("system")))] = p
    reused = reused_answers(list(reuse), set(encode["train"]), "training") if reuse else []
    reused_held = reused_answers(list(reuse_heldout), set(encode["held"]), "held-out") if reuse_heldout else []
    taken = {tuple(r["prompt"]) for r in reused}
    fresh = [p for ids, p in encode["train"].items() if ids not in taken]
    rng = np.random.default_rng(cfg.seed)
    fresh = [fresh[i] for i in rng.permutation(len(fresh))[: cfg.answer_prompts]]
    kinds = ("chat", "summary", "code")
    n = cfg.heldout_answer_prompts
    held_by_kind = {k: [p for p in held_p if p["kind"] == k][: n if reused_held else 2 * n] for k in kinds}
    eos = turn_end_id(target, tok)
    log(
        f"prompts: {len(train_p)} training ({len(reused)} reused sampled answers, {len(fresh)} fresh prompts), "
        f"held out per kind { ({k: len(v) for k, v in held_by_kind.items()}) } (split {percent}%, docs {docs})"
    )

    def answered(prompts: list[dict], sample: bool, what: str) -> list[tuple[list[int], list[int], str]]:
        t0 = time.perf_counter()
        rows = []
        for b in range(0, len(prompts), cfg.gen_batch):
            chunk = prompts[b : b + cfg.gen_batch]
            batch = [chat_prompt_ids(tok, p["user"], p.get("system")) for p in chunk]
            rows += [
                (ids, ans, p["kind"])
                for p, ids, (ans, _, _) in zip(
                    chunk, batch, sd.answer_batch(target, tok, batch, cfg, eos, cfg.answer_max_new, sample)
                )
            ]
            made = sum(len(r[1]) for r in rows)
            log(
                f"  {what}: {len(rows)}/{len(prompts)} answered, {made} tokens, "
                f"{made / (time.perf_counter() - t0):.1f} tokens/s"
            )
        return rows

    def cached(rows, what):
        t0 = time.perf_counter()
        out = cache_answers(
            target, layers, [(p, a) for p, a, *_ in rows], eos, cfg.seq_len, cfg.top_k, max(1, cfg.gen_batch // 4)
        )
        log(f"cached {len(rows)} {what} ({int(out.valid.sum())} label positions) in {time.perf_counter() - t0:.0f}s")
        return out

    if reused:
        greedy, sampled = answered(fresh, False, "training prompts, greedy"), []
    else:
        greedy = answered(fresh[0::2], False, "training prompts, greedy")
        sampled = answered(fresh[1::2], True, "training prompts, sampled")
    sampled += [(r["prompt"], r["answer"], r["kind"]) for r in reused]
    held_greedy = answered([p for v in held_by_kind.values() for p in v[:n]], False, "held-out prompts, greedy")
    if reused_held:
        held_sampled = [(r["prompt"], r["answer"], r["kind"]) for r in reused_held]
    else:
        held_sampled = answered([p for v in held_by_kind.values() for p in v[n:]], True, "held-out prompts, sampled")

    root = tm.stdlib_root()
    files = tm.list_stdlib_files(root)
    train_files, held_files = tm.split_files(files, cfg.heldout_percent)
    held_summaries = [p["user"].split(": ", 1)[-1] for p in held_p if p["kind"] == "summary"]
    stream, text_prov = chat_text_stream(tok, cfg, train_files, root, held_summaries, rng)
    held_stream = tm.encode_corpus(tok, [tm.read_text(root, f) for f in held_files[:40]])

    def text(stream, count, random):
        t0 = time.perf_counter()
        tokens = text_windows(stream, count, cfg.seq_len, rng if random else None)
        out = cache_sequences(
            target,
            layers,
            tokens,
            torch.ones_like(tokens, dtype=torch.bool),
            torch.zeros(count, dtype=torch.long),
            cfg.top_k,
            max(1, cfg.gen_batch // 4),
        )
        log(f"cached {count} text windows ({count * cfg.seq_len} tokens) in {time.perf_counter() - t0:.0f}s")
        return out

    train = Cached.join([cached(greedy + sampled, "training answers"), text(stream, cfg.text_windows, True)])
    train = train.rows(torch.from_numpy(rng.permutation(len(train))))
    held = {
        "text": text(held_stream, cfg.heldout_text_windows, False),
        **{f"greedy-{k}": cached([r for r in held_greedy if r[2] == k], f"held-out {k} answers") for k in kinds},
        "sampled": cached(held_sampled, "held-out sampled answers"),
    }
    prov = {
        "source": "the target's answers to training/smollm2_prompts.py's training prompts under its chat "
        "template (greedy, and sampled at T = 1), CPython stdlib and Python documentation windows",
        "prompt_heldout_percent": percent,
        "train_prompts_answered": {"greedy": len(greedy), "sampled": len(sampled)},
        "reused_sampled_answers": [str(f) for f in reuse],
        "reused_heldout_sampled_answers": [str(f) for f in reuse_heldout],
        "heldout_prompts": {
            "greedy": {k: sum(r[2] == k for r in held_greedy) for k in kinds},
            "sampled": len(held_sampled),
        },
        "answer_tokens": {"greedy": sum(len(r[1]) for r in greedy), "sampled": sum(len(r[1]) for r in sampled)},
        "python_version": platform.python_version(),
        "stdlib_path": str(root),
        "stdlib_heldout_percent": cfg.heldout_percent,
        **text_prov,
    }
    return train, held, prov


def shard_cache(folders: list[Path], target, tok, cfg: Config, layers: tuple[int, ...]) -> tuple[Cached, dict, dict]:
    """training/data.py's shards (one folder or several) as this trainer's cache (the same
    features, top-K and labels)."""
    import data as data_mod

    from specscope.core.loading.chat import turn_end_id

    for folder in folders:
        stored, top_k = data_mod.stored_layers(folder)
        if tuple(stored) != tuple(layers):
            raise SystemExit(
                f"train_head: the shards in {folder} hold layers {tuple(stored)}, this run reads {tuple(layers)} "
                f"(pass --layers {','.join(map(str, stored))})"
            )
        if top_k < cfg.top_k:
            raise SystemExit(f"train_head: the shards in {folder} hold the top-{top_k}, this run needs top-{cfg.top_k}")
    eos = turn_end_id(target, tok) if is_chat(tok) else tok.eos_token_id
    return data_mod.head_sets(folders, cfg.seq_len, cfg.top_k, eos, cfg.seed)


# ---------------------------------------------------------------------------- the head


def choose_draft_vocab(train: Cached, vocab: int, size: int) -> torch.Tensor:
    """The `size` target ids with the most probability mass in the target's top-K
    distributions over the training positions, ascending (EAGLE-3 takes the most frequent
    tokens of its training data; the mass also counts what sampling draws)."""
    ids = train.top_ids[train.valid].long().reshape(-1)
    mass = torch.zeros(vocab, dtype=torch.float64).index_add_(
        0, ids, train.top_logp[train.valid].double().exp().reshape(-1)
    )
    return torch.sort(torch.topk(mass, min(size, vocab)).indices).values


def default_layers(target_layers: int) -> tuple[int, int, int]:
    """Low, middle and the deepest layer input EAGLE-3's format can name (the published
    (2, L // 2, L - 3) reads nothing of the top three layers; on an 8-layer target that is
    most of the depth)."""
    return (min(2, target_layers - 1), target_layers // 2, target_layers - 1)


def head_config(target, cfg: Config, layers: tuple[int, ...], draft_vocab: int) -> dict:
    t = target.config.get_text_config()
    hidden = int(t.hidden_size)
    heads = int(t.num_attention_heads)
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "target_hidden_size": hidden,
        "intermediate_size": int(cfg.intermediate or t.intermediate_size),
        "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(t, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(t, "head_dim", None) or hidden // heads),
        "num_hidden_layers": 1,
        "vocab_size": int(target.get_output_embeddings().weight.shape[0]),
        "draft_vocab_size": draft_vocab,
        "rms_norm_eps": float(t.rms_norm_eps),
        "max_position_embeddings": int(t.max_position_embeddings),
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(layers)},
    }
    rope = getattr(t, "rope_parameters", None)
    if rope:
        config["rope_parameters"] = dict(rope)
    return config


def new_head(target, config: dict, vocab_ids: torch.Tensor):
    """An Eagle3Head (the serving module) with lm_head and norm from the target's."""
    from specscope.core.draft.heads.base import llama_config
    from specscope.core.draft.heads.eagle3 import Eagle3Head, layer_ids

    head = Eagle3Head(llama_config(config, "eagle3"), own_embedding=False, layers=layer_ids(config))
    with torch.no_grad():
        head.d2t.copy_(vocab_ids - torch.arange(len(vocab_ids)))
        head.t2d.zero_().index_fill_(0, vocab_ids, True)
        head.lm_head.weight.copy_(target.get_output_embeddings().weight[vocab_ids])
        final_norm = getattr(getattr(target, "model", None), "norm", None)
        if final_norm is not None and final_norm.weight.shape == head.norm.weight.shape:
            head.norm.weight.copy_(final_norm.weight)
    head.attach(target)
    return head


def unroll(head, embed, features: torch.Tensor, tokens: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """The head's outputs (B, n, H) at depths 0..depth-1 for every anchor j = 0..n-1 (n = T - 1):
    depth s reads token x_{j+s+1} at rotary position j + s and attends to the depth-0 entries
    0..j and its own chain's entries of depths 1..s, as RecurrentHeadProposer.propose does.
    features: (B, T, 3H); tokens: (B, T). Tokens past the end are id 0 (their outputs are
    masked by the caller)."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    layer = head.midlayer
    attn = layer.self_attn
    b, t = tokens.shape
    n = t - 1
    nh, nkv, d = attn.heads, attn.kv_heads, attn.head_dim
    padded = torch.cat([tokens, tokens.new_zeros(b, depth)], dim=1)
    hidden = head.fc(features[:, :n])
    causal = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril()
    real_k = real_v = None
    chain_k: list[torch.Tensor] = []
    chain_v: list[torch.Tensor] = []
    outs = []
    for s in range(depth):
        x = torch.cat(
            [layer.input_layernorm(embed(padded[:, s + 1 : s + 1 + n]).to(hidden.dtype)), layer.hidden_norm(hidden)],
            dim=-1,
        )
        q = attn.q_proj(x).view(b, n, nh, d).transpose(1, 2)
        k = attn.k_proj(x).view(b, n, nkv, d).transpose(1, 2)
        v = attn.v_proj(x).view(b, n, nkv, d).transpose(1, 2)
        positions = (torch.arange(n, device=tokens.device) + s)[None].expand(b, n)
        q, k = apply_rotary_pos_emb(q, k, *head.rope(hidden, positions))
        k, v = k.repeat_interleave(nh // nkv, dim=1), v.repeat_interleave(nh // nkv, dim=1)
        if s == 0:
            real_k, real_v = k, v
            mixed = F.scaled_dot_product_attention(q, k, v, attn_mask=causal)
        else:
            chain_k.append(k)
            chain_v.append(v)
            scale = 1.0 / math.sqrt(d)
            to_real = (q @ real_k.transpose(-1, -2) * scale).masked_fill(~causal, float("-inf"))  # (B, h, n, n)
            to_chain = torch.stack([(q * ck).sum(-1) for ck in chain_k], dim=-1) * scale  # (B, h, n, s)
            weights = torch.softmax(torch.cat([to_real, to_chain], dim=-1).float(), dim=-1).to(q.dtype)
            mixed = weights[..., :n] @ real_v + (weights[..., n:, None] * torch.stack(chain_v, dim=-2)).sum(-2)
        out = hidden + attn.o_proj(mixed.transpose(1, 2).reshape(b, n, nh * d))
        hidden = out + layer.mlp(layer.post_attention_layernorm(out))
        outs.append(hidden)
    return outs


def depth_labels(batch: Cached, s: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Depth s's labels for anchors 0..n-1: the target's top-K at position j + s + 1, and
    whether that position exists and is a label."""
    pos = torch.arange(n) + s + 1
    inside = pos < batch.tokens.shape[1]
    pos = pos.clamp(max=batch.tokens.shape[1] - 1)
    mask = batch.valid[:, pos] & inside[None]
    return batch.top_ids[:, pos].long(), batch.top_logp[:, pos].float(), mask


def coarse_kl(
    logits: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor, to_draft: torch.Tensor
) -> torch.Tensor:
    """KL(p || q) per row, p = the target's top-K inside the draft vocabulary plus one bucket
    for the rest of its mass, q = the head's distribution coarsened the same way."""
    log_q = F.log_softmax(logits.float(), dim=-1)
    draft_ids = to_draft[top_ids]
    inside = draft_ids >= 0
    lq_top = log_q.gather(-1, draft_ids.clamp(min=0))
    p_top = top_logp.exp() * inside
    p_rest = (1 - p_top.sum(-1)).clamp_min(1e-6)
    q_rest = (1 - (lq_top.exp() * inside).sum(-1)).clamp_min(1e-6)
    return (p_top * (top_logp - lq_top)).sum(-1) + p_rest * (p_rest.log() - q_rest.log())


def losses(head, embed, batch: Cached, cfg: Config, to_draft: torch.Tensor):
    """Per depth: (mean coarse KL, correct argmax count, label count); the weighted loss."""
    features = batch.features.flatten(2).float()
    with tm.autocast():
        outs = unroll(head, embed, features, batch.tokens, cfg.depth)
    n = batch.tokens.shape[1] - 1
    total, stats = 0.0, []
    for s, hidden in enumerate(outs):
        ids, logp, mask = depth_labels(batch, s, n)
        # the lm_head (most of a step's work) on the labelled positions only: a chat sequence's
        # prompt and padding are no labels
        logits = head.lm_head(head.norm(hidden[mask].float()))
        kl = coarse_kl(logits, ids[mask], logp[mask], to_draft)
        correct = (head.draft_to_target[logits.argmax(-1)] == ids[mask][:, 0]).sum()
        total = total + cfg.decay**s * kl.mean()
        stats.append((kl.mean().detach(), int(correct), int(mask.sum())))
    return total, stats


# ---------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate(head, embed, held: dict[str, Cached], cfg: Config, to_draft: torch.Tensor) -> dict:
    """Held-out per-depth accuracy (head argmax == target argmax) per set, the coarse KL, and
    on the greedy generations (each set named greedy*) the expected accepted length of a greedy
    chain of cfg.depth."""
    head.eval()
    result: dict = {}
    for name, data in held.items():
        correct = np.zeros(cfg.depth)
        count = np.zeros(cfg.depth)
        kl_sum = 0.0
        runs, anchors = 0.0, 0
        for b in range(0, len(data), cfg.batch):
            batch = data.rows(slice(b, b + cfg.batch))
            with tm.autocast():
                outs = unroll(head, embed, batch.features.flatten(2).float(), batch.tokens, cfg.depth)
            n = batch.tokens.shape[1] - 1
            hits = []
            for s, hidden in enumerate(outs):
                ids, logp, mask = depth_labels(batch, s, n)
                logits = head.lm_head(head.norm(hidden.float()))
                hit = head.draft_to_target[logits.argmax(-1)] == ids[..., 0]
                correct[s] += float((hit & mask).sum())
                count[s] += float(mask.sum())
                if s == 0:
                    kl_sum += float(coarse_kl(logits[mask], ids[mask], logp[mask], to_draft).sum())
                hits.append(hit & mask)
            if name.startswith("greedy"):  # anchors whose next token was generated and whose whole chain is labelled
                _, _, last = depth_labels(batch, cfg.depth - 1, n)
                anchor = (torch.arange(n)[None] >= batch.first[:, None]) & last
                run = torch.cumprod(torch.stack(hits, -1).float(), dim=-1).sum(-1)
                runs += float(run[anchor].sum())
                anchors += int(anchor.sum())
        result[name] = {
            "accuracy_by_depth": [round(float(c / max(1.0, m)), 4) for c, m in zip(correct, count)],
            "kl_depth0": round(kl_sum / max(1.0, count[0]), 4),
            "positions": int(count[0]),
        }
        if name.startswith("greedy"):
            result[name]["accepted_length"] = round(1 + runs / max(1, anchors), 4)
            result[name]["chains"] = anchors
    weights = {name: r["positions"] for name, r in result.items()}
    total = sum(weights.values())
    result["all"] = [
        round(sum(result[nm]["accuracy_by_depth"][s] * w for nm, w in weights.items()) / max(1, total), 4)
        for s in range(cfg.depth)
    ]
    head.train()
    return result


def coverage(held: dict[str, Cached], vocab_ids: torch.Tensor, vocab: int) -> float:
    """Fraction of held-out positions whose target argmax the draft vocabulary holds."""
    inside = torch.zeros(vocab, dtype=torch.bool).index_fill_(0, vocab_ids, True)
    hits = total = 0
    for data in held.values():
        top1 = data.top_ids[..., 0].long()[data.valid]
        hits += int(inside[top1].sum())
        total += int(top1.numel())
    return round(hits / max(1, total), 4)


# ---------------------------------------------------------------------------- training


def lr_factor(step: int, progress: float, warmup: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def train(
    head,
    embed,
    data: Cached,
    held: dict[str, Cached],
    cfg: Config,
    to_draft: torch.Tensor,
    log,
    minutes: float | None,
    measure_start: bool = False,
) -> list[dict]:
    """AdamW on the depth-weighted coarse KL until cfg.steps or the wall-clock budget, whichever
    ends first (the cosine schedule follows whichever is further used). `measure_start`: the
    held-out sets measured before the first step too (step 0: a continued head's starting
    point on this run's held-out answers)."""
    evals = []
    if measure_start:
        evals.append({"step": 0, **evaluate(head, embed, held, cfg, to_draft)})
        log(f"step 0: held-out {json.dumps(evals[-1])}")
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = np.random.default_rng([cfg.seed, 7])
    start = time.perf_counter()
    budget = minutes * 60 if minutes else None
    running = np.zeros((cfg.depth, 3))
    done = 0
    for step in range(cfg.steps):
        progress = step / cfg.steps
        if budget is not None:
            used = time.perf_counter() - start
            if used >= budget:
                log(f"step {step}: time budget of {minutes} min reached")
                break
            progress = max(progress, used / budget)
        for group in opt.param_groups:
            group["lr"] = cfg.lr * lr_factor(step, progress, cfg.warmup)
        batch = data.rows(torch.from_numpy(rng.choice(len(data), size=cfg.batch, replace=False)))
        loss, stats = losses(head, embed, batch, cfg, to_draft)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        done = step + 1
        running += np.array([[kl.item(), c, m] for kl, c, m in stats])
        if (step + 1) % cfg.log_every == 0:
            n = cfg.log_every
            acc = " ".join(f"{c / max(1, m):.3f}" for _, c, m in running)
            kls = " ".join(f"{kl / n:.3f}" for kl, _, _ in running)
            log(
                f"step {step + 1}: KL by depth {kls}; accuracy by depth {acc}; lr {opt.param_groups[0]['lr']:.2e}; "
                f"{(time.perf_counter() - start) / (step + 1):.2f}s/step"
            )
            running[:] = 0
        if (step + 1) % cfg.eval_every == 0:
            evals.append({"step": step + 1, **evaluate(head, embed, held, cfg, to_draft)})
            log(f"step {step + 1}: held-out {json.dumps(evals[-1])}")
    if not evals or evals[-1]["step"] != done:
        evals.append({"step": done, **evaluate(head, embed, held, cfg, to_draft)})
        log(f"step {done}: held-out {json.dumps(evals[-1])}")
    return evals


# ---------------------------------------------------------------------------- output


def save_head(head, config: dict, out: Path) -> int:
    """config.json and model.safetensors in the EAGLE-3 format; the weights' bytes."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    weights = {
        name: (t.detach().to(torch.bfloat16) if t.is_floating_point() else t.detach()).contiguous()
        for name, t in head.state_dict().items()
    }
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # save_file leaves it readable by its owner only
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return (out / "model.safetensors").stat().st_size


def target_name(path: str) -> str:
    """How the config names the target: the bundled one by its name, a fetched one by its
    catalog name (`smollm2`), any other by its path."""
    from specscope.core.loading import catalog

    bundled = (REPO / "resources" / "models" / "target").resolve()
    if Path(path).expanduser().resolve() == bundled:
        return "specscope/target"
    named = catalog.lookup(path) if not Path(path).expanduser().exists() else None
    return named.name if named is not None else str(path)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--target",
        default=str(REPO / "resources" / "models" / "target"),
        help="the target: a checkpoint folder or a fetched model's name, e.g. smollm2 (default: the "
        "bundled target); one with a chat template trains on its chat answers",
    )
    ap.add_argument("--out", type=Path, default=REPO / "resources" / "models" / "eagle3-target")
    ap.add_argument("--smoke", action="store_true", help="a small cache and a few steps (about a minute)")
    ap.add_argument("--minutes", type=float, default=None, help="wall-clock budget of the training loop")
    ap.add_argument("--layers", help="three target hidden-state indices, e.g. 2,4,7 (default: 2, L//2, L-1)")
    for name in (
        "draft_vocab",
        "depth",
        "steps",
        "batch",
        "text_windows",
        "gen_prompts",
        "gen_prompt_len",
        "heldout_text_windows",
        "heldout_gen_prompts",
        "threads",
        "seq_len",
        "eval_every",
        "seed",
        "answer_prompts",
        "answer_max_new",
        "heldout_answer_prompts",
        "gen_batch",
        "intermediate",
    ):
        ap.add_argument("--" + name.replace("_", "-"), type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument(
        "--init",
        type=Path,
        help="continue from this head (a folder this script wrote, for the same target and layers): its "
        "weights, shape and draft vocabulary; the schedule starts afresh",
    )
    ap.add_argument(
        "--data",
        type=Path,
        nargs="+",
        help="train on training/data.py's shards in this folder, or several (runs with other seeds, read as "
        "one set): their answers, features and top-K, held-out sets per kind; instead of generating here; "
        "--layers must match the shards'",
    )
    ap.add_argument(
        "--reuse-answers",
        type=Path,
        nargs="*",
        default=[],
        help="a chat target: training/train_smollm2_draft.py's cached answers to training prompts "
        "(--work/train-*.pt, sampled at T = 1) to train on instead of sampling afresh",
    )
    ap.add_argument(
        "--reuse-heldout-answers",
        type=Path,
        nargs="*",
        default=[],
        help="a chat target: its cached held-out answers (--work/held-*.pt) as the held-out sampled set",
    )
    return ap.parse_args(argv)


def read_init(folder: Path, layers: tuple[int, ...], vocab: int) -> tuple[dict, torch.Tensor]:
    """The config and draft vocabulary (ascending target ids) of the head --init names; refuses
    one whose layers or vocabulary differ from this run's."""
    from safetensors import safe_open

    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            d2t = f.get_tensor("d2t").long()
    except (OSError, ValueError, KeyError) as exc:
        raise SystemExit(f"train_head: --init {folder}: not a head this script wrote ({exc})") from None
    theirs = tuple(config.get("eagle_config", {}).get("eagle_aux_hidden_state_layer_ids", ()))
    if theirs != tuple(layers):
        raise SystemExit(f"train_head: --init {folder} reads layers {theirs}, this run {tuple(layers)}")
    if int(config.get("vocab_size", -1)) != vocab:
        raise SystemExit(f"train_head: --init {folder} has {config.get('vocab_size')} ids, the target {vocab}")
    return config, d2t + torch.arange(len(d2t))


def target_folder(target: str) -> Path:
    """The checkpoint folder --target names: a path, or a fetched model's name (`smollm2`)."""
    from specscope.core.loading import catalog

    if not Path(target).expanduser().exists() and catalog.lookup(target) is not None:
        return catalog.resolve(target)
    return Path(target).expanduser()


def is_chat(tok) -> bool:
    """A target whose tokenizer ships a chat template trains on its chat answers."""
    return bool(getattr(tok, "chat_template", None))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from specscope.core.loading import load_model, load_tokenizer
    from specscope.core.loading.errors import CheckpointError

    try:
        folder = target_folder(args.target)
        target = load_model(folder, device="cpu", dtype="float32", role="target")
        tok = load_tokenizer(folder)
    except CheckpointError as exc:
        raise SystemExit(f"train_head: {exc}") from None
    chat = is_chat(tok)
    cfg = (CHAT_SMOKE if args.smoke else CHAT) if chat else (SMOKE if args.smoke else Config())
    cfg = replace(
        cfg,
        **{k: v for k, v in vars(args).items() if k in Config.__dataclass_fields__ and v is not None and k != "layers"},
    )
    if not chat and not 0 < cfg.gen_prompt_len < cfg.seq_len:
        raise SystemExit(
            f"train_head: --gen-prompt-len {cfg.gen_prompt_len} must be between 1 and --seq-len {cfg.seq_len} "
            "(a continuation fills the rest of the sequence)"
        )
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    target_layers = int(target.config.get_text_config().num_hidden_layers)
    layers = tuple(int(v) for v in args.layers.split(",")) if args.layers else default_layers(target_layers)
    if len(layers) != 3 or not all(0 <= i < target_layers for i in layers):
        raise SystemExit(
            f"train_head: --layers needs three indices in 0..{target_layers - 1} (the inputs of the "
            f"target's layers), got {layers}"
        )
    cfg = replace(cfg, layers=layers)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    log = tm.Log(out / "train_log.txt")
    t_start = time.perf_counter()
    log(
        f"train_head ({'smoke' if args.smoke else 'full'}{', chat' if chat else ''}): target {args.target}, python "
        f"{platform.python_version()}, "
        f"torch {torch.__version__}, threads {cfg.threads}; config {json.dumps(asdict(cfg))}"
    )
    vocab = int(target.get_output_embeddings().weight.shape[0])
    init = read_init(args.init, layers, vocab) if args.init else None  # refused before the cache is built

    if args.data:
        data, held, prov = shard_cache(args.data, target, tok, cfg, layers)
    elif chat:
        data, held, prov = build_chat_cache(
            target, tok, cfg, layers, log, args.reuse_answers, args.reuse_heldout_answers
        )
    else:
        data, held, prov = build_cache(target, tok, cfg, layers, log)
    vocab = int(target.get_output_embeddings().weight.shape[0])
    vocab_ids = init[1] if init else choose_draft_vocab(data, vocab, cfg.draft_vocab)
    to_draft = torch.full((vocab,), -1, dtype=torch.long).index_copy_(0, vocab_ids, torch.arange(len(vocab_ids)))
    cover = coverage(held, vocab_ids, vocab)
    log(
        f"cache: {len(data)} training sequences of {cfg.seq_len} tokens, {data.features.numel() * 2 / 1e6:.0f} MB of "
        f"features; draft vocabulary {len(vocab_ids)} of {vocab} ids holds {cover:.1%} of the held-out target argmaxes"
    )
    config = head_config(target, cfg, layers, len(vocab_ids))
    if init:
        config = {k: v for k, v in init[0].items() if k != "specscope"}
    torch.manual_seed(cfg.seed + 1)
    head = new_head(target, config, vocab_ids).train()
    if init:
        from specscope.core.draft.heads.base import load_exactly, read_weights
        from specscope.core.draft.heads.eagle3 import eagle3_names

        weights = eagle3_names(read_weights(args.init, "eagle3"))
        load_exactly(head, {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}, "eagle3")
        log(f"continuing from {args.init} (steps before: {init[0].get('specscope', {}).get('steps', '?')})")
    embed = target.get_input_embeddings()
    n_params = sum(p.numel() for p in head.parameters())
    log(f"head: {n_params / 1e6:.2f}M parameters, layers {layers}, depth {cfg.depth}")
    t_train = time.perf_counter()
    evals = train(head, embed, data, held, cfg, to_draft, log, args.minutes, measure_start=init is not None)
    train_s = time.perf_counter() - t_train
    final = evals[-1]
    config["specscope"] = {
        "trained_by": "training/train_head.py" + (" --smoke" if args.smoke else ""),
        "target": target_name(args.target),
        "unroll_depth": cfg.depth,
        "accuracy_by_depth": final["all"],
        # what the labels (and so the measures) count: a chat sequence's answer positions only,
        # what serving drafts (the app's calibration view flags a chat record without this)
        "labels": "answers" if chat else "all positions",
        "heldout": {k: v for k, v in final.items() if k not in ("step", "all")},
        "draft_vocab_coverage": cover,
        "steps": final["step"],
    }
    weight_bytes = save_head(head, config, out)
    total = time.perf_counter() - t_start
    log(
        f"done in {total / 60:.1f} min ({train_s / 60:.1f} min training); weights {weight_bytes / 1e6:.2f} MB; "
        f"held-out accuracy by depth {final['all']}"
    )
    summary = {
        "mode": "smoke" if args.smoke else "full",
        "config": asdict(cfg),
        "data": prov,
        "draft_vocab_coverage": cover,
        "params": n_params,
        "evals": evals,
        "train_s": round(train_s, 1),
        "total_s": round(total, 1),
        "weight_bytes": weight_bytes,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
        },
    }
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    log.close()
    return summary


if __name__ == "__main__":
    main()

"""Train the project's draft for SmolLM2-135M-Instruct (resources/models/smollm2-draft).

Distillation from the target's own distributions, on text available offline:
  1. chat answers: the target answers the training prompts of training/smollm2_prompts.py
     (questions, summaries of Python documentation paragraphs, code tasks) by batched sampling
     at temperature 1; the top-K of its next-token distribution at every answer position is
     kept as it samples (no second pass);
  2. text: windows of the CPython standard library's training files (training/train_models.py's
     split) and of the Python documentation sources (Debian `python3-doc`), with the target's
     top-K next-token distributions from one batched forward each.
The draft minimises KL(p || q) between the target's distribution p and its own q, both
coarsened to the teacher's top-K tokens plus one bucket for the rest (exact for the coarsened
distributions; the bucket keeps q from putting mass where p has none).

The draft is a Llama with the target's tokenizer, a narrow hidden size (the 49,152-token
embedding dominates its bytes) and tied embeddings initialised from the top principal
directions of SmolLM2's own tied embedding (E @ V_r, V_r the top-r eigenvectors of E^T E).

    nice -n 10 python training/train_smollm2_draft.py --work /tmp/w          # full run
    python training/train_smollm2_draft.py --smoke --work /tmp/s --out /tmp/s/draft

The teacher data is cached under --work (re-running skips what is there). Outputs: the draft
(bfloat16 safetensors + the tokenizer) in --out, train_log.txt and training.json beside it.
"""

from __future__ import annotations

import argparse
import hashlib
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
import smollm2_prompts as prompts_mod
import train_models as tm

REPO = Path(__file__).resolve().parent.parent
STDLIB_HELDOUT_PERCENT = 5  # stdlib files whose path hash falls below this are never used


@dataclass(frozen=True)
class Config:
    seed: int = 1234
    heldout_percent: int = 12
    top_k: int = 32  # teacher tokens kept per position (plus a "rest" bucket)
    gen_batch: int = 16
    gen_max_new: int = 128
    train_prompts: int = 10_000  # at most this many training prompts are answered
    heldout_max_new: int = 64
    heldout_prompts: int = 25
    text_windows: int = 16  # windows of text with teacher distributions
    text_len: int = 256
    hidden: int = 192
    layers: int = 2
    heads: int = 3
    intermediate: int = 768
    steps: int = 100_000  # in practice the wall-clock budget ends training
    chat_batch: int = 4  # chat sequences per step
    text_batch: int = 1  # text windows per step
    text_weight: float = 0.5
    lr: float = 3e-3
    embed_lr: float = 1e-3
    warmup: int = 10
    eval_every: int = 30
    log_every: int = 10
    threads: int = 1


SMOKE = replace(
    Config(),
    train_prompts=6,
    gen_batch=3,
    gen_max_new=12,
    heldout_max_new=8,
    heldout_prompts=3,
    text_windows=2,
    text_len=32,
    steps=4,
    chat_batch=2,
    text_batch=1,
    warmup=1,
    eval_every=2,
    log_every=1,
    layers=1,
)


# ---------------------------------------------------------------------------- teacher data


class TopKCapture:
    """A logits processor that keeps the top-K log-probabilities of every step's distribution."""

    def __init__(self, k: int):
        self.k, self.ids, self.logp = k, [], []

    def __call__(self, input_ids, scores):
        logp = F.log_softmax(scores.float(), dim=-1)
        v, i = logp.topk(self.k, dim=-1)
        self.ids.append(i.to(torch.int32))
        self.logp.append(v.to(torch.float16))
        return scores


def chat_ids(tok, p: dict) -> list[int]:
    from specscope.core.loading.chat import chat_prompt_ids

    return chat_prompt_ids(tok, p["user"], p.get("system"))


@torch.no_grad()
def answer_batch(target, tok, batch: list[list[int]], cfg: Config, eos: int, max_new: int, sample: bool):
    """Sample answers for a batch of prompt ids: per prompt (answer ids, top-K ids, top-K log-probs)."""
    from transformers import GenerationConfig, LogitsProcessorList

    width = max(len(b) for b in batch)
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    ids = torch.tensor([[pad] * (width - len(b)) + b for b in batch])
    mask = torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in batch])
    cap = TopKCapture(cfg.top_k)
    gen = GenerationConfig(
        do_sample=sample,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    out = target.generate(
        input_ids=ids, attention_mask=mask, generation_config=gen, logits_processor=LogitsProcessorList([cap])
    )
    new = out[:, width:]
    top_ids, top_logp = torch.stack(cap.ids, 1), torch.stack(cap.logp, 1)
    results = []
    for r in range(len(batch)):
        row = new[r].tolist()
        n = row.index(eos) + 1 if eos in row else len(row)
        results.append((row[:n], top_ids[r, :n].numpy(), top_logp[r, :n].numpy()))
    return results


def answer_prompts(
    target,
    tok,
    prompts: list[dict],
    cfg: Config,
    eos: int,
    max_new: int,
    log,
    what: str,
    cache: Path,
    until: float | None = None,
) -> list[dict]:
    """Answer the prompts by sampling, a batch at a time, saving after each batch (resumable), and
    stopping at the wall-clock time `until` (epoch seconds) when one is given."""
    out: list[dict] = torch.load(cache, weights_only=False) if cache.is_file() else []
    if out:
        log(f"{what}: resuming with {len(out)} answered prompts from {cache}")
    t0 = time.perf_counter()
    for b in range(len(out), len(prompts), cfg.gen_batch):
        if until is not None and time.time() > until:
            log(f"{what}: time budget reached")
            break
        chunk = prompts[b : b + cfg.gen_batch]
        encoded = [chat_ids(tok, p) for p in chunk]
        for p, ids, (ans, ti, tl) in zip(chunk, encoded, answer_batch(target, tok, encoded, cfg, eos, max_new, True)):
            out.append({"prompt": ids, "answer": ans, "top_ids": ti, "top_logp": tl, "kind": p["kind"]})
        torch.save(out, cache)
        log(
            f"{what}: {len(out)}/{len(prompts)} prompts answered, {sum(len(o['answer']) for o in out)} answer "
            f"tokens, {time.perf_counter() - t0:.0f}s"
        )
    return out


def text_corpus(tok, cfg: Config, rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """Random windows of the stdlib's training files and the Python docs sources, half each."""
    root = tm.stdlib_root()
    files = tm.list_stdlib_files(root)
    train_files, _ = tm.split_files(files, STDLIB_HELDOUT_PERCENT)
    docs = prompts_mod.docs_root()
    doc_files = sorted(docs.rglob("*.rst.txt")) if docs else []
    windows = []
    for _source, paths, reader in (
        ("stdlib", train_files, lambda f: tm.read_text(root, f)),
        ("docs", doc_files, lambda f: f.read_text(encoding="utf-8", errors="replace")),
    ):
        want = cfg.text_windows // 2 if doc_files else cfg.text_windows
        picked = rng.choice(len(paths), size=min(len(paths), want * 2), replace=False)
        got = 0
        for i in picked:
            ids = tok(reader(paths[i]))["input_ids"]
            if len(ids) <= cfg.text_len:
                continue
            start = int(rng.integers(0, len(ids) - cfg.text_len))
            windows.append(ids[start : start + cfg.text_len])
            got += 1
            if got == want:
                break
    prov = {
        "stdlib": {"python": platform.python_version(), "files_in_split": len(train_files), "path": str(root)},
        "docs": {"path": str(docs), "files": len(doc_files)},
    }
    return np.asarray(windows, dtype=np.int32), prov


@torch.no_grad()
def teacher_text(target, windows: np.ndarray, cfg: Config, log) -> tuple[np.ndarray, np.ndarray]:
    ids_out, logp_out = [], []
    t0 = time.perf_counter()
    for b in range(0, len(windows), 4):
        x = torch.from_numpy(windows[b : b + 4]).long()
        logp = F.log_softmax(target(input_ids=x, use_cache=False).logits.float(), dim=-1)
        v, i = logp.topk(cfg.top_k, dim=-1)
        ids_out.append(i.to(torch.int32).numpy())
        logp_out.append(v.to(torch.float16).numpy())
        if (b // 4) % 8 == 0:
            log(f"text teacher: {b + len(x)}/{len(windows)} windows, {time.perf_counter() - t0:.0f}s")
    return np.concatenate(ids_out), np.concatenate(logp_out)


# ---------------------------------------------------------------------------- the draft


def make_draft(target, cfg: Config):
    """A narrow Llama with the target's tokenizer ids, rope and norm settings; embedding from PCA."""
    from transformers import LlamaConfig, LlamaForCausalLM

    t = target.config
    conf = LlamaConfig(
        vocab_size=t.vocab_size,
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.heads,
        max_position_embeddings=t.max_position_embeddings,
        rms_norm_eps=t.rms_norm_eps,
        rope_parameters=getattr(t, "rope_parameters", None),
        tie_word_embeddings=True,
        bos_token_id=t.bos_token_id,
        eos_token_id=t.eos_token_id,
        pad_token_id=t.pad_token_id,
    )
    draft = LlamaForCausalLM(conf)
    e = target.get_input_embeddings().weight.detach().float()
    _, vecs = torch.linalg.eigh(e.T @ e)  # ascending eigenvalues
    basis = vecs[:, -cfg.hidden :].flip(-1)
    with torch.no_grad():
        draft.get_input_embeddings().weight.copy_(e @ basis)
    draft.tie_weights()
    draft.generation_config.eos_token_id = target.generation_config.eos_token_id
    draft.generation_config.pad_token_id = target.generation_config.pad_token_id
    return draft


def coarse_kl(student_logits: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor) -> torch.Tensor:
    """KL(p || q) of the distributions coarsened to the teacher's top-K tokens plus a rest bucket; per row."""
    log_q = F.log_softmax(student_logits.float(), dim=-1)
    lq_top = log_q.gather(-1, top_ids.long())
    lp_top = top_logp.float()
    p_top = lp_top.exp()
    p_rest = (1 - p_top.sum(-1)).clamp_min(1e-8)
    q_rest = (1 - lq_top.exp().sum(-1)).clamp_min(1e-8)
    return (p_top * (lp_top - lq_top)).sum(-1) + p_rest * (p_rest.log() - q_rest.log())


def coarse_alpha(student_logits: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor) -> torch.Tensor:
    """sum over the teacher's top-K of min(p, q): a lower bound on sum_x min(p, q); per row."""
    q = F.softmax(student_logits.float(), dim=-1).gather(-1, top_ids.long())
    return torch.minimum(q, top_logp.float().exp()).sum(-1)


def chat_batch(rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded [prompt + answer] ids, and (row, position) of each answer prediction with its teacher."""
    seqs = [r["prompt"] + r["answer"] for r in rows]
    width = max(len(s) for s in seqs)
    x = torch.zeros(len(seqs), width, dtype=torch.long)
    where, ids, logp = [], [], []
    for b, (r, s) in enumerate(zip(rows, seqs)):
        x[b, : len(s)] = torch.tensor(s)
        start = len(r["prompt"]) - 1  # the position whose next token is the answer's first
        where += [(b, start + j) for j in range(len(r["answer"]))]
        ids.append(torch.from_numpy(r["top_ids"]))
        logp.append(torch.from_numpy(r["top_logp"]))
    w = torch.tensor(where)
    return x, w, torch.cat(ids), torch.cat(logp)


def student_logits_at(draft, x: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """The draft's logits at chosen (row, position) pairs only (the vocabulary head is most of the cost)."""
    h = draft.model(input_ids=x, use_cache=False).last_hidden_state
    return draft.lm_head(h[where[:, 0], where[:, 1]])


def text_batch(windows: np.ndarray, t_ids: np.ndarray, t_logp: np.ndarray, pick: np.ndarray):
    x = torch.from_numpy(windows[pick]).long()
    n, length = x.shape
    where = torch.stack(torch.meshgrid(torch.arange(n), torch.arange(length), indexing="ij"), -1).reshape(-1, 2)
    k = t_ids.shape[-1]
    return x, where, torch.from_numpy(t_ids[pick]).reshape(-1, k), torch.from_numpy(t_logp[pick]).reshape(-1, k)


def lr_factor(step: int, progress: float, cfg: Config) -> float:
    """Linear warm-up, then a cosine decay to 5% over `progress` (0..1: steps or time budget used)."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def heldout_alpha(draft, held: list[dict]) -> dict:
    """Coarse (top-K lower bound) alpha and KL on the held-out answers, overall and per kind."""
    draft.eval()
    sums: dict[str, list[float]] = {}
    for r in held:
        x, where, ti, tl = chat_batch([r])
        logits = student_logits_at(draft, x, where)
        a, kl = coarse_alpha(logits, ti, tl), coarse_kl(logits, ti, tl)
        for key in ("all", r["kind"]):
            s = sums.setdefault(key, [0.0, 0.0, 0])
            s[0] += float(a.sum())
            s[1] += float(kl.sum())
            s[2] += len(a)
    draft.train()
    return {
        k: {"alpha_lb": round(v[0] / v[2], 4), "kl": round(v[1] / v[2], 4), "positions": v[2]} for k, v in sums.items()
    }


def train(
    draft, train_rows: list[dict], held_rows: list[dict], text: tuple, cfg: Config, log, until: float | None = None
) -> list[dict]:
    """AdamW on the coarse KL; ends after cfg.steps or at the wall-clock time `until`, whichever
    comes first (the learning-rate schedule follows whichever budget is further used)."""
    windows, t_ids, t_logp = text
    embed = [draft.get_input_embeddings().weight]
    rest = [p for p in draft.parameters() if p is not embed[0]]
    opt = torch.optim.AdamW(
        [{"params": rest, "lr": cfg.lr}, {"params": embed, "lr": cfg.embed_lr}], betas=(0.9, 0.98), weight_decay=0.0
    )
    base = [cfg.lr, cfg.embed_lr]
    rng = np.random.default_rng(cfg.seed + 1)
    evals = [{"step": 0, **heldout_alpha(draft, held_rows)}]
    log(f"step 0: held-out {evals[-1]['all']}")
    t0, running, start = time.perf_counter(), [], time.time()
    done = 0  # steps taken (the budget may end the loop before its first step)
    for step in range(cfg.steps):
        progress = step / cfg.steps
        if until is not None:
            if time.time() >= until:
                log(f"step {step}: time budget reached")
                break
            progress = max(progress, (time.time() - start) / max(1.0, until - start))
        for g, lr in zip(opt.param_groups, base):
            g["lr"] = lr * lr_factor(step, progress, cfg)
        rows = [train_rows[i] for i in rng.choice(len(train_rows), size=cfg.chat_batch, replace=False)]
        x, where, ti, tl = chat_batch(rows)
        loss_chat = coarse_kl(student_logits_at(draft, x, where), ti, tl).mean()
        loss = loss_chat
        if len(windows) and cfg.text_batch:
            x, where, ti, tl = text_batch(windows, t_ids, t_logp, rng.choice(len(windows), size=cfg.text_batch))
            loss = loss + cfg.text_weight * coarse_kl(student_logits_at(draft, x, where), ti, tl).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        done = step + 1
        running.append(loss_chat.item())
        if (step + 1) % cfg.log_every == 0:
            log(
                f"step {step + 1}: chat KL {np.mean(running):.4f} (last {len(running)}), lr "
                f"{opt.param_groups[0]['lr']:.2e}, "
                f"{(time.perf_counter() - t0) / (step + 1):.2f}s/step"
            )
            running = []
        if (step + 1) % cfg.eval_every == 0:
            evals.append({"step": step + 1, **heldout_alpha(draft, held_rows)})
            log(f"step {step + 1}: held-out {evals[-1]}")
    if evals[-1]["step"] != done:
        evals.append({"step": done, **heldout_alpha(draft, held_rows)})
        log(f"step {done}: held-out {evals[-1]}")
    return evals


# ---------------------------------------------------------------------------- exact measures


@torch.no_grad()
def exact_alpha(target, draft, held_rows: list[dict]) -> dict:
    """alpha = mean over the held-out answers' positions of sum_x min(p, q), full distributions."""
    sums: dict[str, list[float]] = {}
    for r in held_rows:
        x, where, _, _ = chat_batch([r])
        p = F.softmax(target(input_ids=x, use_cache=False).logits[0, where[:, 1]].float(), -1)
        q = F.softmax(student_logits_at(draft, x, where).float(), -1)
        a = torch.minimum(p, q).sum(-1)
        for key in ("all", r["kind"]):
            s = sums.setdefault(key, [0.0, 0])
            s[0] += float(a.sum())
            s[1] += len(a)
    return {k: {"alpha": round(v[0] / v[1], 4), "positions": v[1]} for k, v in sums.items()}


@torch.no_grad()
def forward_cost(target, draft, held_rows: list[dict], reps: int = 5) -> dict:
    """Median single-token forward (with a KV cache at the prompt's length), draft vs target."""
    times: dict[str, list[float]] = {"target": [], "draft": []}
    for r in held_rows[:8]:
        x = torch.tensor([r["prompt"]])
        for name, model in (("target", target), ("draft", draft)):
            past = model(input_ids=x[:, :-1], use_cache=True).past_key_values
            for _ in range(reps):
                t = time.perf_counter()
                model(input_ids=x[:, -1:], past_key_values=past, use_cache=True)
                times[name].append(time.perf_counter() - t)
                past.crop(-1)
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {
        "target_ms": round(med["target"] * 1e3, 3),
        "draft_ms": round(med["draft"] * 1e3, 3),
        "cost": round(med["draft"] / med["target"], 4),
    }


# ---------------------------------------------------------------------------- main


def load_target(threads: int):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specscope.core.loading import catalog
    from specscope.core.loading.chat import turn_end_id

    torch.set_num_threads(threads)
    folder = catalog.resolve("smollm2")
    target = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    return target, tok, turn_end_id(target, tok), folder


def cached(path: Path, make, log):
    """Teacher data is expensive: compute once, keep it under --work."""
    if path.is_file():
        log(f"reusing {path}")
        return torch.load(path, weights_only=False)
    value = make()
    torch.save(value, path)
    return value


def clock(hhmm: str | None) -> float | None:
    """Epoch seconds of today's HH:MM UTC (a wall-clock budget), None for none."""
    if not hhmm:
        return None
    import datetime as dt

    h, m = (int(v) for v in hhmm.split(":"))
    now = dt.datetime.now(dt.UTC)
    return now.replace(hour=h, minute=m, second=0, microsecond=0).timestamp()


def stratified(prompts: list[dict], n: int) -> list[dict]:
    """The first n held-out prompts taken round-robin over the kinds (the bundled ones come first)."""
    by_kind: dict[str, list[dict]] = {}
    for p in prompts:
        by_kind.setdefault(p["kind"], []).append(p)
    out, i = [], 0
    while len(out) < min(n, len(prompts)):
        for kind in sorted(by_kind):
            if i < len(by_kind[kind]) and len(out) < n:
                out.append(by_kind[kind][i])
        i += 1
    return out


def save_draft(draft, tok, out: Path) -> None:
    m = draft.to(torch.bfloat16)
    m.config._name_or_path = "specscope/smollm2-draft"
    out.mkdir(parents=True, exist_ok=True)
    m.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    for f in out.glob("*.safetensors"):  # safetensors leaves them readable by their owner only
        f.chmod(0o644)
    draft.float()


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "resources" / "models" / "smollm2-draft")
    ap.add_argument("--work", type=Path, required=True, help="folder for the cached teacher data")
    ap.add_argument("--smoke", action="store_true", help="a few prompts and steps, to check the pipeline")
    ap.add_argument("--gen-until", help="HH:MM (UTC): stop answering training prompts then")
    ap.add_argument("--train-until", help="HH:MM (UTC): stop training then")
    ap.add_argument(
        "--shard",
        default="0/1",
        help="I/N: answer every N-th training prompt from the I-th (parallel "
        "workers); the training run (shard 0) reads every shard's answers",
    )
    ap.add_argument(
        "--stage",
        choices=("all", "answers", "text", "train"),
        default="all",
        help="answers: only answer this shard's training prompts; text: only the text teacher; train: "
        "train on what the workers cached (waiting for the text teacher's file); all: the whole recipe",
    )
    ap.add_argument(
        "--init",
        type=Path,
        help="continue from this draft (a folder this script wrote): its weights and shape; the schedule starts afresh",
    )
    ap.add_argument(
        "--data",
        type=Path,
        nargs="+",
        help="train on training/data.py's shards in this folder, or several (runs with other seeds): the "
        "target's answers and top-K, instead of answering prompts here",
    )
    for field in (
        "train_prompts",
        "text_windows",
        "steps",
        "layers",
        "hidden",
        "intermediate",
        "heads",
        "heldout_prompts",
        "gen_max_new",
        "threads",
        "eval_every",
        "chat_batch",
        "text_batch",
    ):
        ap.add_argument("--" + field.replace("_", "-"), type=int)
    for field in ("lr", "embed_lr"):  # a continued draft (--init) starts lower than a fresh one
        ap.add_argument("--" + field.replace("_", "-"), type=float)
    return ap.parse_args(argv)


def init_draft(folder: Path, target, log):
    """The draft --init names, refused in one line unless it is a causal LM over the target's vocabulary."""
    from transformers import AutoModelForCausalLM

    try:
        draft = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise SystemExit(f"train_smollm2_draft: --init {folder}: {exc}") from None
    if draft.config.vocab_size != target.config.vocab_size:
        raise SystemExit(
            f"train_smollm2_draft: --init {folder} has {draft.config.vocab_size} ids, the target "
            f"{target.config.vocab_size}"
        )
    log(f"continuing from {folder}")
    return draft.train()


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    cfg = SMOKE if args.smoke else Config()
    cfg = replace(cfg, **{k: v for k, v in vars(args).items() if k in Config.__dataclass_fields__ and v is not None})
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    shard, shards = (int(v) for v in args.shard.split("/"))
    worker = "" if args.stage in ("all", "train") else f".{args.stage}-{shard}of{shards}"
    log = tm.Log(args.out / f"train_log{worker}.txt", append=True)
    log(f"config {json.dumps(asdict(cfg))}")
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    target, tok, eos, folder = load_target(cfg.threads)
    docs = prompts_mod.docs_root()
    train_p, held_p = prompts_mod.split_prompts(prompts_mod.build_prompts(docs) if docs else [], cfg.heldout_percent)
    train_p = [train_p[i] for i in rng.permutation(len(train_p))[: cfg.train_prompts]]  # kinds mixed
    held_p = stratified(held_p, cfg.heldout_prompts)
    log(f"prompts: {len(train_p)} training, {len(held_p)} held-out (docs: {docs})")
    tag = f"k{cfg.top_k}-n{cfg.gen_max_new}"
    if args.data is not None:
        import data as data_mod

        held_rows = stratified(data_mod.draft_rows(args.data, "held", cfg.top_k), cfg.heldout_prompts)
    elif args.stage in ("all", "answers", "train"):
        held_rows = answer_prompts(
            target,
            tok,
            held_p,
            cfg,
            eos,
            cfg.heldout_max_new,
            log,
            "held-out",
            args.work / f"held-{tag}-{len(held_p)}-{cfg.heldout_max_new}.pt",
        )
    if args.stage in ("all", "answers") and args.data is None:
        answer_prompts(
            target,
            tok,
            train_p[shard::shards],
            cfg,
            eos,
            cfg.gen_max_new,
            log,
            "train",
            args.work / f"train-{tag}-{len(train_p)}-s{shard}of{shards}.pt",
            until=clock(args.gen_until),
        )
        if args.stage == "answers":
            return {}
    windows, text_prov = text_corpus(tok, cfg, rng)
    # named by the windows' contents: the teacher's distributions belong to these exact windows
    # (another corpus, e.g. without the documentation sources, gives other windows of the same shape)
    digest = hashlib.sha256(np.ascontiguousarray(windows).tobytes()).hexdigest()[:12]
    text_file = args.work / f"text-{cfg.top_k}-{len(windows)}x{cfg.text_len}-{digest}.pt"
    shard_files = f"train-{tag}-{len(train_p)}-s*of{shards}.pt"
    waiting = args.stage == "train" and args.data is None
    while waiting and not (text_file.is_file() and len(list(args.work.glob(shard_files))) == shards):
        time.sleep(10)  # the text worker or an answering worker has not saved yet
    t_ids, t_logp = cached(text_file, lambda: teacher_text(target, windows, cfg, log), log)
    if args.stage == "text":
        return {}
    if args.data is not None:
        train_rows = data_mod.draft_rows(args.data, "train", cfg.top_k)
    else:
        train_rows = [r for f in sorted(args.work.glob(shard_files)) for r in torch.load(f, weights_only=False)]
    source = (
        f"training/data.py's shards in {', '.join(map(str, args.data))}"
        if args.data is not None
        else f"{shards} shards"
    )
    log(f"training answers: {len(train_rows)} answers, {sum(len(r['answer']) for r in train_rows)} tokens ({source})")
    draft = init_draft(args.init, target, log) if args.init else make_draft(target, cfg)
    log(f"draft: {sum(p.numel() for p in draft.parameters()) / 1e6:.2f}M parameters")
    t0 = time.perf_counter()
    evals = train(draft, train_rows, held_rows, (windows, t_ids, t_logp), cfg, log, until=clock(args.train_until))
    train_s = time.perf_counter() - t0
    save_draft(draft, tok, args.out)
    draft = type(draft).from_pretrained(args.out, dtype=torch.float32).eval()  # measure what ships
    alpha = exact_alpha(target, draft, held_rows)
    cost = forward_cost(target, draft, held_rows)
    log(f"exact held-out alpha {alpha}; cost {cost}")
    size = sum(f.stat().st_size for f in args.out.glob("*.safetensors"))
    report = {
        "config": asdict(cfg),
        "target": {"checkpoint": str(folder), "model": "SmolLM2-135M-Instruct Q4_1"},
        "data": {
            # with --data the answers are the shards' (their own prompt set and split)
            "source": source if args.data is not None else "smollm2_prompts.py",
            "train_prompts": len({tuple(r["prompt"]) for r in train_rows}) if args.data is not None else len(train_p),
            "heldout_prompts": len(held_rows) if args.data is not None else len(held_p),
            "train_answer_tokens": sum(len(r["answer"]) for r in train_rows),
            "heldout_answer_tokens": sum(len(r["answer"]) for r in held_rows),
            "text_windows": len(windows),
            "text_tokens": int(windows.size),
            **text_prov,
        },
        "train_seconds": round(train_s, 1),
        "evals": evals,
        "heldout_alpha": alpha,
        "forward_cost": cost,
        "weights_bytes": size,
        "torch": torch.__version__,
        "machine": platform.machine(),
    }
    (args.out / "training.json").write_text(json.dumps(report, indent=1) + "\n")
    log.close()
    return report


if __name__ == "__main__":
    main()

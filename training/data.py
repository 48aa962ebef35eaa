"""Training data at the machine's speed (issue 41): the target's own answers, its features and
its distributions, cached on disk in resumable shards.

Three stages, each resumable (a killed run continues where it stopped), each with a progress line:
  1. prompts: a broad offline prompt set for a chat target (`prompts.jsonl`): the hand-written and
     documentation prompts of training/smollm2_prompts.py, prompts the target itself writes from
     seed instructions (questions, prose requests, code tasks across topics, sampled at T = 1),
     summaries of Python documentation paragraphs (Debian `python3-doc`) and of standard library
     module docstrings. Every prompt has a kind (chat, prose, summary, code) and a split: held
     out when a hash of its text says so (smollm2_prompts.is_heldout, the SmolLM2 draft's 12%),
     and the bundled prompts of resources/prompts/chat.json always.
  2. answers: the target answers the prompts in real batches (`answers-NNNNN.pt`): left-padded
     rows with a KV cache that appends into spare room (no copy of the cache per step) and
     explicit position ids; a row that ends (turn end / EOS, or --max-new tokens) stays, unread,
     until a quarter of the rows have ended; then they leave together and new prompts are
     prefilled and merged into the running cache (continuous refill); prompts are taken
     shortest first, so a prefill pads little. Greedy or sampled at T = 1 (no top-k/top-p) per
     job; a sampled row draws from its own seeded generator, so its answer does not depend on
     the batch it ran in. Training prompts are answered round after round (round 0: greedy and
     sampled alternately; later rounds: sampled with a new seed) until --tokens answer tokens;
     held-out prompts once, greedily, up to --heldout-per-kind per kind.
  3. features: one prefill-style pass of the target over every (prompt + answer) sequence, and
     over windows of standard library and documentation text (kind `text`), in right-padded
     batches sorted by length (`features-NNNNN.pt`, one per answers shard): the chosen layers'
     hidden states (bfloat16, what the EAGLE-3 head reads) and the top-K next-token
     log-probabilities at every position (what the head and the draft distil).

    python -m training.data --target smollm2 --tokens 1000000 --out DIR     # the real run
    python -m training.data --target smollm2 --tokens 3000 --out /tmp/d --per-topic 1

`load_rows(DIR, split)` reads the shards back; `draft_rows` and `head_cached` give what
training/train_smollm2_draft.py and training/train_head.py train on. Threads: torch's OpenMP
pool spins while it waits; on a shared machine that costs more than the second thread gains,
so this entry point sets OMP_WAIT_POLICY=PASSIVE before torch loads and defaults to one thread
(training/measure_speed.py measures batch sizes and thread counts).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch's OpenMP starts: no spinning barrier

import argparse
import hashlib
import json
import re
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import smollm2_prompts as prompts_mod

KINDS = ("chat", "prose", "summary", "code")
HELDOUT_PERCENT = 12  # the SmolLM2 draft's and head's prompt split: their held-out prompts stay held out
Log = Callable[[str], None]


# ---------------------------------------------------------------------------- batched generation


@dataclass
class Job:
    """One answer to make: the prompt's ids, greedy or sampled (with its own seed)."""

    key: str
    prompt: list[int]
    sample: bool = False
    seed: int = 0
    temperature: float = 1.0  # sampled rows only
    answer: list[int] = field(default_factory=list)
    gen: torch.Generator | None = None


def _pick(logits: torch.Tensor, rows: list[Job | None]) -> list[int]:
    """Each row's next token: argmax, or a draw at the row's temperature from its own generator
    by inverting the row's CDF at one uniform (float64, so no mass is lost over a 49k-id
    vocabulary). All sampled rows are drawn together: an exponential race (49k draws a row)
    spent 10% of a batch-128 SmolLM2 step in `exponential_`. A finished row (None) gets the
    argmax, which nothing reads."""
    out = logits.argmax(-1).tolist()
    pairs = [(i, job) for i, job in enumerate(rows) if job is not None and job.sample]
    if not pairs:
        return out
    sampled, jobs = [i for i, _ in pairs], [job for _, job in pairs]
    temps = torch.tensor([j.temperature for j in jobs], dtype=torch.float64).unsqueeze(1)
    cdf = F.softmax(logits[sampled].double() / temps, -1).cumsum_(-1)
    u = torch.cat([torch.rand(1, generator=j.gen, dtype=torch.float64) for j in jobs])
    # u * total, not u: the float64 cumsum's last entry may fall short of 1 by rounding
    picks = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
    for i, token in zip(sampled, picks.clamp_max(logits.shape[-1] - 1).tolist()):
        out[i] = token
    return out


def _cache_layers(cache: Any) -> list[Any]:
    return list(cache.layers)


def _append(buf: torch.Tensor | None, used: int, new: torch.Tensor) -> tuple[torch.Tensor, int]:
    """`new` written after the `used` positions of `buf` (B, H, T, D), into its spare room; a
    buffer without room (or of another batch) is copied once into one with half again as much."""
    n = new.shape[-2]
    if buf is None or buf.dim() != 4 or buf.shape[:2] != new.shape[:2] or buf.shape[-2] < used + n:
        grown = new.new_empty(*new.shape[:2], used + n + max(64, (used + n) // 2), new.shape[-1])
        if used:
            assert buf is not None
            grown[..., :used, :] = buf[..., :used, :]
        buf = grown
    buf[..., used : used + n, :] = new
    return buf, used + n


class _Used:
    """A cache tensor attribute that reads as the used part of its buffer (B, H, T, D); assigning
    a tensor replaces the buffer, all of it used."""

    def __init__(self, buffer: str, used: str):
        self.buffer, self.used = buffer, used

    def __get__(self, layer: Any, owner: Any = None) -> torch.Tensor | None:
        buf = getattr(layer, self.buffer)
        return buf if buf is None or buf.dim() != 4 else buf[..., : getattr(layer, self.used), :]

    def __set__(self, layer: Any, value: torch.Tensor | None) -> None:
        setattr(layer, self.buffer, value)
        setattr(layer, self.used, value.shape[-2] if value is not None and value.dim() == 4 else 0)


def _roomy_layer() -> type:
    """transformers' DynamicLayer appends a decoded position with torch.cat, copying the whole
    cache every step: 42% of a SmolLM2 decode step at batch 128 and 250 positions (profiled with
    torch.profiler). This layer appends into spare room instead; `keys`/`values` are views of the
    used part, and assigning them (a merge, a row selection) replaces the buffer."""
    from transformers.cache_utils import DynamicLayer

    class RoomyLayer(DynamicLayer):  # type: ignore[misc]
        _k: torch.Tensor | None = None
        _v: torch.Tensor | None = None
        _nk = _nv = 0

        keys = _Used("_k", "_nk")
        values = _Used("_v", "_nv")

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            self._k, self._nk = _append(self._k, self._nk, key_states)
            self._v, self._nv = _append(self._v, self._nv, value_states)
            return self.keys, self.values

    return RoomyLayer


_ROOMY: list[type] = []


def _new_cache() -> Any:
    """A DynamicCache whose layers append into spare room (_roomy_layer)."""
    from transformers import DynamicCache

    if not _ROOMY:
        _ROOMY.append(_roomy_layer())
    cache = DynamicCache()
    cache.layer_class_to_replicate = _ROOMY[0]
    return cache


def _cache_kw(model: Any) -> str:
    """The forward's name for the KV cache (transformers 5.x renames past_key_values to cache)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _merge(cache: Any, mask: torch.Tensor, new: Any, new_mask: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """Two batches' KV caches side by side: the shorter one left-padded (masked) to the longer."""
    width = max(mask.shape[1], new_mask.shape[1])

    def pad(t: torch.Tensor, w: int) -> torch.Tensor:  # (B, H, T, D) on the time axis, at the left
        return F.pad(t, (0, 0, width - w, 0)) if w < width else t

    for a, b in zip(_cache_layers(cache), _cache_layers(new)):
        a.keys = torch.cat([pad(a.keys, mask.shape[1]), pad(b.keys, new_mask.shape[1])])
        a.values = torch.cat([pad(a.values, mask.shape[1]), pad(b.values, new_mask.shape[1])])
    m = torch.cat([F.pad(mask, (width - mask.shape[1], 0)), F.pad(new_mask, (width - new_mask.shape[1], 0))])
    return cache, m


def _select(cache: Any, mask: torch.Tensor, keep: list[int]) -> tuple[Any, torch.Tensor]:
    """Only the rows `keep`; leading columns that are padding in every kept row are cut."""
    index = torch.tensor(keep, dtype=torch.long)
    mask = mask[index]
    real = mask.any(0).nonzero()
    start = int(real[0]) if len(real) else 0
    for layer in _cache_layers(cache):
        layer.keys = layer.keys[index, :, start:]
        layer.values = layer.values[index, :, start:]
    return cache, mask[:, start:]


@torch.no_grad()
def _prefill(model: Any, jobs: list[Job], pad_id: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """Left-padded prompts through the model: (cache, mask, last-position logits)."""
    width = max(len(j.prompt) for j in jobs)
    ids = torch.full((len(jobs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(jobs), width), dtype=torch.long)
    for i, j in enumerate(jobs):
        ids[i, width - len(j.prompt) :] = torch.tensor(j.prompt)
        mask[i, width - len(j.prompt) :] = 1
    pos = (mask.cumsum(1) - 1).clamp_min(0)
    cache = _new_cache()
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=pos,
        use_cache=True,
        logits_to_keep=1,
        **{_cache_kw(model): cache},
    )
    return cache, mask, out.logits[:, -1]


@torch.no_grad()
def generate(
    model: Any,
    jobs: list[Job],
    *,
    max_new: int,
    stop: set[int],
    batch: int = 32,
    pad_id: int = 0,
    refill: bool = True,
    more: Callable[[], bool] | None = None,
) -> Iterator[Job]:
    """Answer every job in batches with a KV cache; yields each job as its answer ends (its stop
    token included, as a run commits it). A row that ends stays in the batch, its output unread,
    until a quarter of the batch has ended: then the ended rows leave it together (one copy of
    the cache, not one per ended row) and, with `refill`, new prompts join the running batch
    (else when it is empty). When `more` is given and returns False, no new prompt starts (the
    running rows finish)."""
    for j in jobs:
        if j.sample and j.gen is None:
            j.gen = torch.Generator().manual_seed(j.seed)
    queue = deque(sorted(jobs, key=lambda j: len(j.prompt)))
    kw = _cache_kw(model)
    rows: list[Job | None] = []  # None: a row that ended, still in the batch
    cache, mask, pos = None, torch.zeros((0, 0), dtype=torch.long), torch.zeros(0, dtype=torch.long)
    logits = torch.zeros(0)
    quarter = max(1, batch // 4)
    while queue or any(r is not None for r in rows):
        if queue and more is not None and not more():
            queue.clear()
            if not any(r is not None for r in rows):
                break
        live = [i for i, r in enumerate(rows) if r is not None]
        low = len(live) <= batch - quarter if refill else not live
        if len(live) < len(rows) and (not live or len(rows) - len(live) >= quarter or (queue and low)):
            if live:
                cache, mask = _select(cache, mask, live)
                pos, logits, rows = pos[live], logits[live], [rows[i] for i in live]
            else:
                rows, cache = [], None
        if queue and low:
            new = [queue.popleft() for _ in range(min(batch - len(rows), len(queue)))]
            new_cache, new_mask, new_logits = _prefill(model, new, pad_id)
            new_pos = new_mask.sum(1)
            if cache is None or not rows:
                cache, mask, pos, logits = new_cache, new_mask, new_pos, new_logits
            else:
                cache, mask = _merge(cache, mask, new_cache, new_mask)
                pos, logits = torch.cat([pos, new_pos]), torch.cat([logits, new_logits])
            rows += new
        chosen = _pick(logits, rows)
        for i, job in enumerate(rows):
            if job is None:
                continue
            job.answer.append(chosen[i])
            if chosen[i] in stop or len(job.answer) >= max_new:
                rows[i] = None
                yield job
        if not any(r is not None for r in rows):
            continue
        mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=torch.long)], 1)
        out = model(
            input_ids=torch.tensor(chosen).unsqueeze(1),
            attention_mask=mask,
            position_ids=pos.unsqueeze(1),
            use_cache=True,
            **{kw: cache},
        )
        logits, pos = out.logits[:, -1], pos + 1


# ---------------------------------------------------------------------------- shards on disk


def _save(obj: Any, path: Path) -> None:
    """Atomically: a killed run leaves no half-written shard."""
    tmp = path.with_suffix(".tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


def _shards(out: Path, stem: str) -> list[Path]:
    return sorted(out.glob(f"{stem}-[0-9][0-9][0-9][0-9][0-9].pt"))


class Progress:
    """A progress line: tokens done, tokens/s, ETA."""

    def __init__(self, what: str, total: int, done: int, log: Log, every: float = 10.0):
        self.what, self.total, self.start_done, self.log, self.every = what, total, done, log, every
        self.t0 = self.last = time.perf_counter()
        self.done = done

    def __call__(self, done: int, force: bool = False, made: int | None = None) -> None:
        """`done` of the total so far; `made`: every token made since the start (the rate), when
        more is made than counts towards the total (held-out answers)."""
        self.done = done
        now = time.perf_counter()
        if not force and now - self.last < self.every:
            return
        self.last = now
        made = done - self.start_done if made is None else made
        rate = made / max(now - self.t0, 1e-9)
        left = max(0, self.total - done)
        share = (done - self.start_done) / made if made else 1.0
        eta = f"{left / (rate * share) / 60:.1f} min" if rate * share > 0 else "?"
        self.log(f"{self.what}: {done}/{self.total} tokens, {rate:.1f} tokens/s, ETA {eta}")


# ---------------------------------------------------------------------------- the prompt set

TOPICS = [
    "cooking",
    "gardening",
    "personal finance",
    "history",
    "astronomy",
    "biology",
    "chemistry",
    "physics",
    "geography",
    "music",
    "painting",
    "films",
    "literature",
    "philosophy",
    "psychology",
    "health",
    "sport",
    "travel",
    "languages",
    "mathematics",
    "statistics",
    "computer networks",
    "operating systems",
    "databases",
    "web development",
    "security",
    "artificial intelligence",
    "electronics",
    "cars",
    "architecture",
    "law",
    "economics",
    "business",
    "marketing",
    "education",
    "parenting",
    "pets",
    "weather",
    "oceans",
    "energy",
    "the environment",
    "space travel",
    "ancient civilisations",
    "mythology",
    "games",
    "fashion",
    "photography",
    "careers",
]
PROSE_FORMS = (
    "a short story",
    "a poem",
    "an email",
    "a paragraph",
    "a blog post",
    "a product description",
    "a short speech",
    "a letter",
    "a dialogue",
    "a list of ideas",
)
CODE_TOPICS = [
    "strings",
    "lists",
    "dictionaries",
    "sets",
    "files",
    "classes",
    "recursion",
    "sorting",
    "searching",
    "regular expressions",
    "dates and times",
    "JSON",
    "CSV files",
    "arithmetic",
    "generators",
    "decorators",
    "exceptions",
    "iterators",
    "unit tests",
    "command-line arguments",
    "matrices",
    "text processing",
    "data validation",
    "simple games",
]
SEED_FORMS = {
    "chat": "Here are two questions people ask an assistant:\n1. Why do cats purr?\n2. How does a "
    "refrigerator keep food cold?\nWrite one new question of that kind about {topic}. Reply with the "
    "question only.",
    "prose": "Here are two requests people send an assistant:\n1. Write a short poem about the sea.\n2. "
    "Compose an email inviting my team to a picnic.\nWrite one new request of that kind asking for "
    "{form} about {topic}. Reply with the request only.",
    "code": "Here are two programming tasks:\n1. Write a Python function that counts the words in a "
    "sentence.\n2. Write a Python class for a bank account with deposit and withdraw methods.\nWrite one "
    "new Python task of that kind about {topic}. Reply with the task only.",
}
PROMPT_TEMPERATURE = 0.7  # the target writing prompts: T = 1 from a 135M model rambles
VERBS = ("write", "compose", "draft", "create", "describe", "tell", "give", "explain", "share", "imagine", "make")
CODE_WORDS = ("python", "function", "program", "class", "script", "code", "implement")


def prompt_key(p: dict) -> str:
    return hashlib.sha256(json.dumps([p.get("system"), p["user"]]).encode()).hexdigest()[:16]


def split_of(p: dict, bundled: set[str]) -> str:
    """Held out by a hash of the prompt's text (the draft's and head's split), or when bundled."""
    return "held" if p["user"] in bundled or prompts_mod.is_heldout(p, HELDOUT_PERCENT) else "train"


def stdlib_docstrings(limit: int) -> list[str]:
    """Module docstrings of the standard library of 40-120 words (summary prompts), sorted."""
    import ast

    root = Path(os.__file__).parent
    out = []
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/__init__.py")):
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8", errors="replace")))
        except (SyntaxError, ValueError):
            continue
        text = " ".join((doc or "").split())
        if 40 <= len(text.split()) <= 120:
            out.append(text)
    return out[:limit]


def seed_jobs(tok: Any, per_topic: int, seed: int, topics_cap: int | None = None) -> list[tuple[str, Job]]:
    """(kind, job): the target asked to write prompts of each kind, per topic, sampled (the first
    `topics_cap` topics of each kind only, when given)."""
    from specscope.core.loading.chat import chat_prompt_ids

    topics = TOPICS + [" ".join(s.split()) for s in ";".join(prompts_mod.SUBJECTS).split(";")]
    jobs = []
    for kind, form in SEED_FORMS.items():
        for ti, topic in enumerate((CODE_TOPICS if kind == "code" else topics)[:topics_cap]):
            for r in range(per_topic):
                text = form.format(topic=topic, form=PROSE_FORMS[(ti + r) % len(PROSE_FORMS)])
                key = f"seed-{kind}-{ti}-{r}"
                s = int(hashlib.sha256(f"{seed}-{key}".encode()).hexdigest()[:8], 16)
                job = Job(key, chat_prompt_ids(tok, text), sample=True, seed=s, temperature=PROMPT_TEMPERATURE)
                jobs.append((kind, job))
    return jobs


def clean_prompt(text: str, kind: str | None = None) -> str | None:
    """The target's written prompt, or None when it is not one: its first line, without a
    number or label, 4-60 words, a question for `chat`, a request that starts with a verb for
    `prose`, a task that names code for `code`."""
    line = text.strip().split("\n")[0].strip()
    line = re.sub(r"^(\d+[.)]\s*|(question|request|task|instruction)\s*:\s*)", "", line, flags=re.I)
    line = line.strip().strip('"').strip()
    words = line.split()
    if not 4 <= len(words) <= 60 or line[-1:] not in ".?!":
        return None
    if kind == "chat" and not line.endswith("?"):
        return None
    if kind == "prose" and words[0].lower().strip(",") not in VERBS + ("please", "can", "could"):
        return None
    if kind == "code" and not any(w in line.lower() for w in CODE_WORDS):
        return None
    return line


def build_prompt_set(
    model: Any,
    tok: Any,
    out: Path,
    *,
    per_topic: int,
    stop: set[int],
    batch: int,
    seed: int,
    log: Log,
    topics_cap: int | None = None,
) -> list[dict]:
    """prompts.jsonl: every prompt with its kind, split and key (made once; read back after)."""
    path = out / "prompts.jsonl"
    if path.is_file():
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    docs = prompts_mod.docs_root()
    prompts = [dict(p) for p in prompts_mod.build_prompts(docs)]
    for p in prompts:  # the hand-written "Give me tips" and "Tell me about" prompts ask for prose
        if p["kind"] == "chat" and p["user"].startswith(("Give me", "Describe", "Tell me")):
            p["kind"] = "prose"
    for i, text in enumerate(stdlib_docstrings(400)):
        lead = ("Summarise in one sentence: ", "Summarise in two sentences: ", "Summarise this paragraph: ")[i % 3]
        prompts.append({"kind": "summary", "user": lead + text})
    jobs = seed_jobs(tok, per_topic, seed, topics_cap)
    kind_of = {j.key: k for k, j in jobs}
    progress = Progress("prompt set", len(jobs) * 48, 0, log)
    made, written = 0, 0
    rejected: list[str] = []
    for job in generate(model, [j for _, j in jobs], max_new=48, stop=stop, batch=batch, pad_id=min(stop)):
        made += len(job.answer)
        raw = tok.decode(job.answer, skip_special_tokens=True)
        text = clean_prompt(raw, kind_of[job.key])
        if text and text.lower() in SEED_FORMS[kind_of[job.key]].lower():  # the seed's own example, copied
            text = None
        if text is None and len(rejected) < 5:
            rejected.append(raw.strip().split("\n")[0][:100])
        if text:
            written += 1
            prompts.append({"kind": kind_of[job.key], "user": text, "source": "target"})
        progress(made)
    bundled = {p["user"] for p in prompts_mod.bundled_prompts()}
    seen, final = set(), []
    for p in prompts + [{k: v for k, v in b.items() if k != "name"} for b in prompts_mod.bundled_prompts()]:
        key = prompt_key(p)
        if key not in seen:
            seen.add(key)
            final.append({**p, "key": key, "split": split_of(p, bundled)})
    _save_text(path, "".join(json.dumps(p) + "\n" for p in final))
    counts = {s: {k: sum(p["split"] == s and p["kind"] == k for p in final) for k in KINDS} for s in ("train", "held")}
    log(f"prompt set: {len(final)} prompts ({written} written by the target of {len(jobs)} asked), {counts}")
    if rejected:
        log(f"prompt set: first rejected writings: {rejected}")
    return final


def _save_text(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


# ---------------------------------------------------------------------------- answers


def answer_jobs(tok: Any, prompts: list[dict], tokens: int, heldout_per_kind: int, seed: int) -> list[Job]:
    """Held-out prompts first (greedy, up to heldout_per_kind a kind), then training rounds: round 0
    greedy and sampled alternately, later rounds sampled with new seeds; enough rounds for
    `tokens` answer tokens if answers average 16 tokens or more (the caller stops at the budget)."""
    from specscope.core.loading.chat import chat_prompt_ids

    encoded: dict[str, list[int]] = {}

    def job(p: dict, r: int, sample: bool) -> Job:
        key = f"{p['key']}-r{r}"
        s = int(hashlib.sha256(f"{seed}-{key}".encode()).hexdigest()[:8], 16)
        if p["key"] not in encoded:  # a prompt is answered in many rounds: its template is applied once
            encoded[p["key"]] = chat_prompt_ids(tok, p["user"], p.get("system"))
        return Job(key, list(encoded[p["key"]]), sample=sample, seed=s)

    held = []
    for kind in KINDS:
        held += [job(p, 0, False) for p in prompts if p["split"] == "held" and p["kind"] == kind][:heldout_per_kind]
    train = [p for p in prompts if p["split"] == "train"]
    order = sorted(train, key=lambda p: hashlib.sha256(f"{seed}-{p['key']}".encode()).hexdigest())
    rounds = max(1, -(-tokens // max(1, 16 * len(order))) + 1)  # answers are >= 16 tokens mostly: a bound
    jobs = [job(p, r, r > 0 or i % 2 == 1) for r in range(rounds) for i, p in enumerate(order)]
    return held + jobs


def make_answers(
    model: Any,
    tok: Any,
    prompts: list[dict],
    out: Path,
    *,
    tokens: int,
    heldout_per_kind: int,
    max_new: int,
    stop: set[int],
    batch: int,
    seed: int,
    log: Log,
    shard_tokens: int = 20_000,
) -> int:
    """Answer shards until `tokens` training answer tokens; returns the training tokens on disk."""
    by_key = {p["key"]: p for p in prompts}
    done: set[str] = set()
    have = 0
    for f in _shards(out, "answers"):
        for r in torch.load(f, weights_only=False):
            done.add(r["key"])
            have += len(r["answer"]) if r["split"] == "train" else 0
    jobs = [j for j in answer_jobs(tok, prompts, tokens, heldout_per_kind, seed) if j.key not in done]
    held_left = [j for j in jobs if by_key[j.key.rsplit("-r", 1)[0]]["split"] == "held"]
    if have >= tokens and not held_left:
        log(f"answers: {have} training tokens already on disk, nothing to do")
        return have
    if done:
        log(f"answers: resuming with {len(done)} answers, {have} training tokens on disk")
    progress = Progress("answers", tokens, have, log)
    pending: list[dict] = []
    pending_tokens = held_tokens = 0
    shard = len(_shards(out, "answers"))

    def flush() -> None:
        nonlocal pending, pending_tokens, shard
        if pending:
            _save(pending, out / f"answers-{shard:05d}.pt")
            shard, pending, pending_tokens = shard + 1, [], 0

    train = [j for j in jobs if by_key[j.key.rsplit("-r", 1)[0]]["split"] == "train"]
    chunks = [held_left] if held_left else []
    step = batch * 8  # training jobs a chunk: the budget is checked between chunks
    chunks += [train[i : i + step] for i in range(0, len(train), step)]
    for chunk in chunks:
        if have >= tokens and chunk is not held_left:
            break
        budget = None if chunk is held_left else (lambda: have < tokens)  # noqa: B023 (reads the running count)
        for job in generate(model, chunk, max_new=max_new, stop=stop, batch=batch, pad_id=min(stop), more=budget):
            p = by_key[job.key.rsplit("-r", 1)[0]]
            pending.append(
                {
                    "key": job.key,
                    "prompt_key": p["key"],
                    "kind": p["kind"],
                    "split": p["split"],
                    "mode": "sampled" if job.sample else "greedy",
                    "seed": job.seed,
                    "prompt": job.prompt,
                    "answer": job.answer,
                }
            )
            pending_tokens += len(job.answer)
            have += len(job.answer) if p["split"] == "train" else 0
            held_tokens += len(job.answer) if p["split"] == "held" else 0
            progress.what = f"answers (training tokens; {held_tokens} held-out tokens made)"
            progress(have, made=have - progress.start_done + held_tokens)
            if pending_tokens >= shard_tokens:
                flush()
    flush()
    progress(have, force=True, made=have - progress.start_done + held_tokens)
    return have


# ---------------------------------------------------------------------------- features


def text_rows(tok: Any, windows: int, length: int, seed: int, held_passages: list[str] = ()) -> list[dict]:
    """Windows of standard library source and of the Python documentation text, half each, as
    feature rows of kind `text` (no chat template, no answer): held out by file (the stdlib's
    files by train_models.py's 3% split of the bundled target, the docs files 5% by a hash of the
    name). A file holding a held-out summary prompt's passage trains no window."""
    import numpy as np
    import train_models as tm

    rng = np.random.default_rng(seed)
    root = tm.stdlib_root()
    train_f, held_f = tm.split_files(tm.list_stdlib_files(root), 3)
    docs = prompts_mod.docs_root()
    doc_files = sorted(str(p.relative_to(docs)) for p in docs.rglob("*.rst.txt")) if docs else []
    doc_held = [f for f in doc_files if tm.is_heldout(f, 5)]
    doc_train = [f for f in doc_files if f not in set(doc_held)]
    rows = []
    sources = [("stdlib", root, train_f, held_f), ("docs", docs, doc_train, doc_held)] if docs else []
    sources = sources or [("stdlib", root, train_f, held_f)]
    for name, base, train_files, held_files in sources:
        for split, files, n in (
            ("train", train_files, windows // len(sources)),
            ("held", held_files, max(1, windows // 20 // len(sources))),
        ):
            got, tries = 0, 0
            while got < n and files and tries < 20 * n:
                tries += 1
                f = files[int(rng.integers(len(files)))]
                text = (base / f).read_text(encoding="utf-8", errors="replace")
                if split == "train" and held_passages:
                    plain = " ".join((prompts_mod.rst_to_text(text) if name == "docs" else text).split())
                    if any(p in plain for p in held_passages):
                        continue
                ids = tok(text, add_special_tokens=False)["input_ids"]
                if len(ids) <= length:
                    continue
                start = int(rng.integers(0, len(ids) - length))
                rows.append(
                    {
                        "key": f"text-{name}-{split}-{got}",
                        "kind": "text",
                        "source": f"{name}:{f}",
                        "split": split,
                        "mode": "text",
                        "prompt": ids[start : start + length],
                        "answer": [],
                    }
                )
                got += 1
    return rows


def _decoder(model: Any) -> Any:
    return model.model if hasattr(model, "model") else model.get_decoder()


@torch.no_grad()
def feature_shard(model: Any, rows: list[dict], layers: tuple[int, ...], top_k: int, budget: int) -> dict:
    """One pass of the target over each (prompt + answer), right-padded batches of similar
    lengths (padding follows the real tokens: a causal model's real positions never read it):
    the layers' hidden states (bfloat16) and the top-K next-token log-probabilities, flat."""
    seqs = [r["prompt"] + r["answer"] for r in rows]
    order = sorted(range(len(rows)), key=lambda i: len(seqs[i]))
    offsets = [0]
    for s in seqs:
        offsets.append(offsets[-1] + len(s))
    total = offsets[-1]
    hidden = int(model.config.get_text_config().hidden_size)
    feats = torch.zeros((total, len(layers), hidden), dtype=torch.bfloat16)
    top_ids = torch.zeros((total, top_k), dtype=torch.int32)
    top_logp = torch.zeros((total, top_k), dtype=torch.float16)
    head = model.get_output_embeddings()
    b = 0
    while b < len(order):
        width, n = len(seqs[order[b]]), 1
        while b + n < len(order) and (n + 1) * max(width, len(seqs[order[b + n]])) <= budget:
            width, n = max(width, len(seqs[order[b + n]])), n + 1
        chunk = order[b : b + n]
        b += n
        x = torch.zeros((len(chunk), width), dtype=torch.long)
        for i, r in enumerate(chunk):
            x[i, : len(seqs[r])] = torch.tensor(seqs[r])
        out = _decoder(model)(input_ids=x, output_hidden_states=True, use_cache=False)
        f = torch.stack([out.hidden_states[i] for i in layers], dim=2)
        for i, r in enumerate(chunk):
            n_r, o = len(seqs[r]), offsets[r]
            feats[o : o + n_r] = f[i, :n_r].to(torch.bfloat16)
            v, ids = F.log_softmax(head(out.last_hidden_state[i, :n_r]).float(), -1).topk(top_k, -1)
            top_ids[o : o + n_r], top_logp[o : o + n_r] = ids.to(torch.int32), v.to(torch.float16)
    meta = [
        {k: v for k, v in r.items() if k not in ("prompt", "answer")}
        | {"prompt_len": len(r["prompt"]), "length": len(s), "offset": o}
        for r, s, o in zip(rows, seqs, offsets)
    ]
    tokens = torch.tensor([t for s in seqs for t in s], dtype=torch.int32)
    return {
        "rows": meta,
        "tokens": tokens,
        "features": feats,
        "top_ids": top_ids,
        "top_logp": top_logp,
        "layers": list(layers),
        "top_k": top_k,
    }


def make_features(
    model: Any, out: Path, *, layers: tuple[int, ...], top_k: int, budget: int, text: list[dict], log: Log
) -> None:
    """features-NNNNN.pt for every answers-NNNNN.pt that has none yet; features-text-00000.pt."""
    todo = [(f, out / f.name.replace("answers-", "features-")) for f in _shards(out, "answers")]
    todo = [(f, g) for f, g in todo if not g.is_file()]
    text_file = out / "features-text-00000.pt"
    loads = [(torch.load(f, weights_only=False), g) for f, g in todo]
    # the text first: with the first shard's held-out answers, a run stopped early can train
    if text and not text_file.is_file():
        loads.insert(0, (text, text_file))
    total = sum(len(r["prompt"]) + len(r["answer"]) for rows, _ in loads for r in rows)
    progress = Progress("features", total, 0, log, every=0.0)
    done = 0
    for rows, target in loads:
        _save(feature_shard(model, rows, layers, top_k, budget), target)
        done += sum(len(r["prompt"]) + len(r["answer"]) for r in rows)
        progress(done)
    if not loads:
        log("features: every shard has its features")


# ---------------------------------------------------------------------------- reading back


def folders(out: Path | Sequence[Path]) -> list[Path]:
    """One data folder or several (runs with other seeds, read as one set)."""
    return [Path(out)] if isinstance(out, (str, Path)) else [Path(o) for o in out]


def load_rows(
    out: Path | Sequence[Path], split: str | None = None, kinds: tuple[str, ...] | None = None
) -> Iterator[dict]:
    """Every feature row (its meta, `tokens`, `features` (T, layers, H), `top_ids`, `top_logp`
    (T, K): position t's distribution is over the token at t + 1), optionally one split or kinds;
    several folders are read in the order given, and a prompt held out in two of them keeps one
    greedy answer (the split is a hash of the prompt, so the folders agree on it)."""
    held_answers: set[str] = set()
    for f in (f for o in folders(out) for f in sorted(o.glob("features-*.pt"))):
        shard = torch.load(f, weights_only=False)
        for r in shard["rows"]:
            if (split and r["split"] != split) or (kinds and r["kind"] not in kinds):
                continue
            if r["split"] == "held" and r["kind"] != "text":  # text windows differ by seed under one key
                if r["key"] in held_answers:
                    continue
                held_answers.add(r["key"])
            o, n = r["offset"], r["length"]
            yield {
                **r,
                "tokens": shard["tokens"][o : o + n].long(),
                "features": shard["features"][o : o + n],
                "top_ids": shard["top_ids"][o : o + n],
                "top_logp": shard["top_logp"][o : o + n],
            }


def draft_rows(out: Path | Sequence[Path], split: str, top_k: int = 32) -> list[dict]:
    """What train_smollm2_draft.py trains on: per answer, the prompt ids, the answer ids and the
    target's top-K at each position that predicts an answer token (numpy, like its cache)."""
    rows = []
    for r in load_rows(out, split):
        if r["kind"] == "text":
            continue
        p, n = r["prompt_len"], r["length"] - r["prompt_len"]
        rows.append(
            {
                "prompt": r["tokens"][:p].tolist(),
                "answer": r["tokens"][p:].tolist(),
                # copies: a view would keep its whole shard (features included) in memory
                "top_ids": r["top_ids"][p - 1 : p - 1 + n, :top_k].numpy().copy(),
                "top_logp": r["top_logp"][p - 1 : p - 1 + n, :top_k].numpy().copy(),
                "kind": r["kind"],
            }
        )
    return rows


def _own(r: dict) -> dict:
    """A row that no longer keeps its whole shard in memory (load_rows yields views)."""
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in r.items()}


def _cached_from_rows(rows: list[dict], seq_len: int, top_k: int, stop: int):
    """train_head.py's Cached from rows (emptied as they are copied, so the rows and the cache
    are never both whole in memory): each sequence's last seq_len positions (a long prompt loses
    its start, never the answer); an answer's closing stop token and the padding and the
    prompt's positions are no labels; `first` is the prompt's last position (0 for text)."""
    import train_head as th

    n_l, hidden = rows[0]["features"].shape[1:]
    tokens = torch.full((len(rows), seq_len), stop, dtype=torch.long)
    valid = torch.zeros((len(rows), seq_len), dtype=torch.bool)
    first = torch.zeros(len(rows), dtype=torch.long)
    feats = torch.zeros((len(rows), seq_len, n_l, hidden), dtype=torch.bfloat16)
    vocab_big = any(int(r["top_ids"].max()) > torch.iinfo(torch.int16).max for r in rows)
    ids = torch.zeros((len(rows), seq_len, top_k), dtype=torch.int32 if vocab_big else torch.int16)
    logp = torch.zeros((len(rows), seq_len, top_k), dtype=torch.float16)
    for i in range(len(rows)):
        r, rows[i] = rows[i], {}
        start = max(0, r["length"] - seq_len)
        n = r["length"] - start
        tokens[i, :n] = r["tokens"][start:]
        feats[i, :n] = r["features"][start:]
        ids[i, :n] = r["top_ids"][start:, :top_k].to(ids.dtype)
        logp[i, :n] = r["top_logp"][start:, :top_k]
        ends = r["length"] > r["prompt_len"] and int(r["tokens"][-1]) == stop
        first[i] = 0 if r["kind"] == "text" else max(0, r["prompt_len"] - 1 - start)
        # an answer's labels start after the prompt's last position, as train_head.cache_answers
        # has them (the head never drafts the template or the prompt: counting them overstated
        # its chat accuracy); a text window is all labels
        label_from = 0 if r["kind"] == "text" else int(first[i]) + 1
        valid[i, label_from : n - (1 if ends else 0)] = True
    return th.Cached(tokens, feats, ids, logp, valid, first)


def head_cached(out: Path, split: str, seq_len: int, top_k: int, stop: int, kinds: tuple[str, ...] | None = None):
    """What train_head.py trains on (its Cached) from one split (optionally some kinds) of the shards."""
    rows = [_own(r) for r in load_rows(out, split, kinds)]
    if not rows:
        raise SystemExit(f"training.data: no {split} rows in {out}")
    return _cached_from_rows(rows, seq_len, top_k, stop)


def stored_layers(out: Path) -> tuple[list[int], int]:
    """The hidden-state indices and top-K the shards hold."""
    for f in sorted(out.glob("features-*.pt")):
        shard = torch.load(f, weights_only=False)
        return list(shard["layers"]), int(shard["top_k"])
    raise SystemExit(f"training.data: no feature shards in {out} (run `python -m training.data --out {out}`)")


def head_sets(
    out: Path | Sequence[Path], seq_len: int, top_k: int, stop: int, seed: int = 1234
) -> tuple[Any, dict[str, Any], dict]:
    """train_head.py's data from the shards of one folder or several, read once: the training
    sequences (answers and text, in a seeded shuffled order) and the held-out sets by name:
    `text`, and `greedy-KIND` for each kind answered (each the union over the folders)."""
    import numpy as np

    outs = folders(out)
    where = ", ".join(map(str, outs))
    groups: dict[str, list[dict]] = {}
    for r in load_rows(outs):
        name = "train" if r["split"] == "train" else ("text" if r["kind"] == "text" else f"greedy-{r['kind']}")
        groups.setdefault(name, []).append(_own(r))
    if not groups.get("train"):
        raise SystemExit(f"training.data: no train rows in {where}")
    if not groups.get("text"):
        raise SystemExit(f"training.data: no held-out text rows in {where}")
    train_rows = groups.pop("train")
    order = np.random.default_rng(seed).permutation(len(train_rows))
    train_rows = [train_rows[i] for i in order]
    train = _cached_from_rows(train_rows, seq_len, top_k, stop)
    held = {"text": _cached_from_rows(groups.pop("text"), seq_len, top_k, stop)}
    for kind in KINDS:
        if f"greedy-{kind}" in groups:
            held[f"greedy-{kind}"] = _cached_from_rows(groups.pop(f"greedy-{kind}"), seq_len, top_k, stop)
    recipes = [json.loads((o / "recipe.json").read_text()) if (o / "recipe.json").is_file() else None for o in outs]
    prov = {
        "source": f"training/data.py's shards in {where}",
        "recipe": recipes[0] if len(recipes) == 1 else recipes,
        "train_sequences": len(train),
        "train_label_positions": int(train.valid.sum()),
        "heldout_sequences": {k: len(v) for k, v in held.items()},
    }
    return train, held, prov


# ---------------------------------------------------------------------------- the command


def load_target(target: str, threads: int) -> tuple[Any, Any, set[int]]:
    """The target (float32, as specscope loads it), its tokenizer and the ids that end an answer."""
    from specscope.core.loading import load_model, load_tokenizer
    from specscope.core.loading.chat import eos_ids, turn_end_id
    from specscope.core.loading.errors import CheckpointError

    torch.set_num_threads(threads)
    import train_head as th

    try:
        folder = th.target_folder(target)
        model = load_model(folder, device="cpu", dtype="float32", role="target")
        tok = load_tokenizer(folder)
    except CheckpointError as exc:
        raise SystemExit(f"training.data: {exc}") from None
    stop = {i for i in [turn_end_id(model, tok), *eos_ids(model, tok)] if i is not None}
    if not stop:
        raise SystemExit("training.data: the target names no EOS token: answers would never end")
    return model, tok, stop


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="The target's answers, features and distributions, cached in shards")
    ap.add_argument("--target", default="smollm2", help="a checkpoint folder or a fetched model's name")
    ap.add_argument("--out", type=Path, required=True, help="the data folder (resumes what is there)")
    ap.add_argument("--tokens", type=int, default=1_000_000, help="training answer tokens to make")
    ap.add_argument("--stage", choices=("all", "prompts", "answers", "features"), default="all")
    ap.add_argument("--batch", type=int, default=32, help="rows decoded together")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (OMP_WAIT_POLICY is PASSIVE here)")
    ap.add_argument("--max-new", type=int, default=160, help="answer tokens at most")
    ap.add_argument("--per-topic", type=int, default=4, help="prompts the target writes per topic and kind")
    ap.add_argument("--topics", type=int, help="the first N topics of each kind only (a small run)")
    ap.add_argument("--heldout-per-kind", type=int, default=40, help="held-out prompts answered per kind")
    ap.add_argument("--layers", help="hidden-state indices to keep, e.g. 2,15,29 (default: 2, L//2, L-1)")
    ap.add_argument("--top-k", type=int, default=32, help="next-token log-probabilities kept per position")
    ap.add_argument("--text-windows", type=int, default=256, help="text windows (stdlib and docs) with features")
    ap.add_argument("--text-len", type=int, default=256)
    ap.add_argument("--feature-tokens", type=int, default=4096, help="tokens per feature batch (rows x width)")
    ap.add_argument("--shard-tokens", type=int, default=20_000, help="answer tokens per shard (what a kill can lose)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument(
        "--no-docs",
        action="store_true",
        help="build without the Python documentation (Debian python3-doc) when it is not installed: "
        "about 30 summary prompts instead of several hundred, and text windows of the stdlib only",
    )
    ap.add_argument(
        "--bfloat16",
        choices=("off", "answers", "all"),
        default="off",
        help="compute under bfloat16 autocast where the CPU has it natively: 'answers' for the prompts the "
        "target writes and its answers (the text; 1.65x here), 'all' also for the features pass (its labels "
        "then agree with the float32 target's top-1 at about 97.6%% of positions; 1.8x)",
    )
    return ap.parse_args(argv)


def compute_context(args: argparse.Namespace, stage: str) -> Any:
    """bfloat16 autocast for `stage` ('answers' or 'features') where --bfloat16 asks for it."""
    import contextlib

    wanted = args.bfloat16 == "all" or (args.bfloat16 == "answers" and stage == "answers")
    return torch.autocast("cpu", dtype=torch.bfloat16) if wanted else contextlib.nullcontext()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import train_models as tm

    for name in ("batch", "threads", "max_new", "top_k", "feature_tokens", "shard_tokens", "text_len"):
        if getattr(args, name) < 1:
            raise SystemExit(f"training.data: --{name.replace('_', '-')} must be at least 1")
    for name in ("tokens", "per_topic", "heldout_per_kind", "text_windows"):
        if getattr(args, name) < 0:
            raise SystemExit(f"training.data: --{name.replace('_', '-')} must not be negative")

    if args.bfloat16 != "off" and not tm.native_bfloat16():
        raise SystemExit(
            "training.data: --bfloat16 needs a CPU that computes bfloat16 natively (AVX-512 BF16 or AMX); "
            "emulated, it is several times slower than float32: leave it off"
        )
    if prompts_mod.docs_root() is None and not args.no_docs:
        raise SystemExit(
            "training.data: the Python documentation is not installed (apt-get install python3-doc): it "
            "gives most summary prompts and half the text windows; install it, or pass --no-docs"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    log = tm.Log(args.out / "data_log.txt", append=True)
    model, tok, stop = load_target(args.target, args.threads)
    n_layers = int(model.config.get_text_config().num_hidden_layers)
    layers = tuple(int(v) for v in args.layers.split(",")) if args.layers else (2, n_layers // 2, n_layers - 1)
    if not all(0 <= i <= n_layers for i in layers):
        raise SystemExit(f"training.data: --layers needs indices in 0..{n_layers}, got {layers}")
    log(
        f"training.data: target {args.target}, threads {torch.get_num_threads()}, OMP_WAIT_POLICY "
        f"{os.environ.get('OMP_WAIT_POLICY')}, batch {args.batch}, {args.tokens} tokens, layers {layers}, "
        f"stop ids {sorted(stop)}, bfloat16 autocast {args.bfloat16}, documentation {prompts_mod.docs_root()}"
    )
    (args.out / "recipe.json").write_text(json.dumps({**vars(args), "out": str(args.out)}, indent=1) + "\n")
    with compute_context(args, "answers"):  # the prompts the target writes and its answers
        prompts = build_prompt_set(
            model,
            tok,
            args.out,
            per_topic=args.per_topic,
            stop=stop,
            batch=args.batch,
            seed=args.seed,
            log=log,
            topics_cap=args.topics,
        )
        if args.stage == "prompts":
            return
        if args.stage in ("all", "answers"):
            make_answers(
                model,
                tok,
                prompts,
                args.out,
                tokens=args.tokens,
                heldout_per_kind=args.heldout_per_kind,
                max_new=args.max_new,
                stop=stop,
                batch=args.batch,
                seed=args.seed,
                log=log,
                shard_tokens=args.shard_tokens,
            )
    if args.stage in ("all", "features"):
        held = [p["user"].split(": ", 1)[-1] for p in prompts if p["kind"] == "summary" and p["split"] == "held"]
        text = text_rows(tok, args.text_windows, args.text_len, args.seed, held) if args.text_windows else []
        with compute_context(args, "features"):
            make_features(
                model, args.out, layers=layers, top_k=args.top_k, budget=args.feature_tokens, text=text, log=log
            )
    log.close()


if __name__ == "__main__":
    main()

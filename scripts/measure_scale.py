"""Memory and time per round of the decoder over a long run at a real vocabulary size.

A random-initialised Llama pair with Qwen2.5's vocabulary (151,936 tokens; target hidden 256,
4 layers; draft hidden 128, 1 layer; tied embeddings) decodes one long run per sampler
setting through the public API (`SpeculativeDecoder(..., k=4).start()`), and the script
consumes the rounds without keeping them, as the CLI's printer does. It reports:

    rss_mb@100 / @1000     peak RSS (VmHWM) after round 100 and round 1000
    growth_kb_per_round    (peak@1000 - peak@100) / 900
    ms/round 50-150        median wall time of one round over rounds 50-150
    ms/round 900-1000      the same over rounds 900-1000 (same run)
    CPU ratio              the same ratio in process CPU time (a virtual machine's stolen
                           time inflates wall time, not CPU time; the JSON rows also give
                           /proc/stat's steal jiffies in each window)
    forwards ms/round      median time inside the two models' forwards in each window: what
                           attention over a longer context adds
    bookkeeping            share of wall time outside the two models' forwards
                           (everything the decoder does besides target and draft forwards)

Usage (numbers in BENCHMARKS.md come from a quiet machine):

    .venv/bin/python scripts/measure_scale.py --rounds 1000 --threads 2 --markdown
    .venv/bin/python scripts/measure_scale.py --rounds 200 --modes t1     # a quick look
    .venv/bin/python scripts/measure_scale.py --target gemma3-270m --rounds 500 --modes greedy  # a real model

`--target` takes a real model instead of the random target (a fetched model's name, a
checkpoint folder or a GGUF file), prompted with the text of the bundled `read-config` example;
its draft is `--draft` (a checkpoint sharing its tokenizer) or else a random-initialised
1-layer Llama (hidden 128) with the target's vocabulary, which the target rejects almost
always: each round then verifies k drafted tokens and emits about one.

`--vectors full` keeps full vectors in every round record (the trace policy `full`); the
default is what a run that stores top-N needs. `--tree SPEC` drafts a token tree instead of a
chain (`DraftModelProposer(draft, tree=SPEC, children=--children)`, depth capped at k). Each
JSON row also gives, per round: `bookkeeping_ms_per_round` (wall time outside the two
models' forwards), `cpu_ms_per_round` (the whole round in process CPU time: steadier than
wall on a loaded machine; the forwards' share of it is the same before and after a
bookkeeping change) and `round_bookkeeping_ms` (the decoder's own RoundTimings.bookkeeping_s), e.g.

    .venv/bin/python scripts/measure_scale.py --rounds 100 --modes t1 --tree 3,2,1 --children topk
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specscope.core import DraftModelProposer, SamplingConfig, SpeculativeDecoder  # noqa: E402

MODES = {
    "greedy": SamplingConfig(temperature=0.0),
    "t1": SamplingConfig(temperature=1.0),
    "t1-topk50-topp0.9": SamplingConfig(temperature=1.0, top_k=50, top_p=0.9),
}


def llama(vocab: int, hidden: int, layers: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    model = LlamaForCausalLM(cfg).eval()
    model.generation_config.pad_token_id = 0
    return model


def real_models(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.nn.Module, list[int]]:
    """--target's model, its draft (--draft, else random with its vocabulary) and a real prompt;
    sets args.vocab to the target's vocabulary (for the table)."""
    from specscope.core.decode.kv import model_vocab_size
    from specscope.core.loading.models import example_prompts, load_models

    pair = load_models(target=args.target, draft=args.draft, device="cpu", dtype="float32")
    args.vocab = model_vocab_size(pair.target)
    draft = pair.draft if pair.draft is not None else llama(args.vocab, 128, 1, seed=1)
    text = next(p.text for p in example_prompts() if p.name == "read-config")
    return pair.target, draft, list(pair.tokenizer(text, add_special_tokens=False)["input_ids"])


def rss_kb(field: str = "VmHWM") -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def budget_for(decoder: SpeculativeDecoder, prompt: list[int], rounds: int) -> int:
    """A budget no run of `rounds` rounds reaches (each emits at most k + 1 tokens; a tree's
    depth + 1), within the target's position limit; SystemExit in one line when the limit
    leaves less (the decoder refuses a run past it)."""
    from specscope.core.loading.models import max_positions

    wanted = 10 * rounds * (decoder.k + 1)
    limit = max_positions(decoder.target)
    if limit is None:
        return wanted
    budget = min(wanted, limit - len(prompt))
    if budget < rounds * (decoder.k + 1):
        raise SystemExit(
            f"measure_scale: the target reads at most {limit} positions; a {len(prompt)}-token prompt "
            f"leaves {max(budget, 0)} new tokens, and --rounds {rounds} may need "
            f"{rounds * (decoder.k + 1)}: lower --rounds"
        )
    return budget


def measure(decoder: SpeculativeDecoder, prompt: list[int], rounds: int, marks: tuple[int, ...]) -> dict:
    handle = decoder.start(prompt, max_new_tokens=budget_for(decoder, prompt, rounds))
    target_lm, draft_lm = decoder.target_lm, decoder.proposer.lm
    per_round: list[float] = []
    cpu_round: list[float] = []  # process CPU time of each round (both threads)
    forward_round: list[float] = []  # time inside the two models' forwards, each round
    steal: list[int] = []  # the machine's steal jiffies after each round (a VM's lost time)
    bookkeeping = 0.0
    peaks: dict[int, int] = {}
    tokens = 0
    started = time.perf_counter()
    cpu_started = time.process_time()
    last, last_cpu, last_fwd = started, cpu_started, 0.0
    for rnd in handle:
        now, cpu_now = time.perf_counter(), time.process_time()
        fwd = target_lm.forward_s + draft_lm.forward_s
        per_round.append(now - last)
        cpu_round.append(cpu_now - last_cpu)
        forward_round.append(fwd - last_fwd)
        steal.append(steal_jiffies())
        last, last_cpu, last_fwd = now, cpu_now, fwd
        tokens += len(rnd.emitted)
        bookkeeping += rnd.timings.bookkeeping_s
        if len(per_round) in marks:
            peaks[len(per_round)] = rss_kb()
        if len(per_round) >= rounds:
            break
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    handle.close()
    forwards = target_lm.forward_s + draft_lm.forward_s
    return {
        "rounds": len(per_round),
        "tokens": tokens,
        "wall_s": wall,
        "per_round_s": per_round,
        "cpu_round_s": cpu_round,
        "forward_round_s": forward_round,
        "steal": steal,
        "peak_rss_kb": peaks,
        "forward_s": forwards,
        "bookkeeping_share": 1 - forwards / wall,
        "cpu_s": cpu,
        "round_bookkeeping_s": bookkeeping,
    }


def steal_jiffies() -> int:
    """The machine's steal time so far (/proc/stat: CPU time the hypervisor gave to others)."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) if len(fields) > 8 and fields[0] == "cpu" else 0
    except OSError:
        return 0


def window_ms(per_round: list[float], lo: int, hi: int) -> float | None:
    chunk = per_round[lo:hi]
    return 1000 * statistics.median(chunk) if chunk else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1000)
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--target-layers", type=int, default=4)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--vectors", choices=("top", "full"), default="top")
    ap.add_argument("--tree", help="draft a token tree of this spec (e.g. 3,2,1) instead of a chain")
    ap.add_argument(
        "--children",
        choices=("sampled", "distinct", "topk"),
        default="topk",
        help="how a tree's children are chosen (with --tree)",
    )
    ap.add_argument("--target", help="a real target: a fetched model's name (gemma3-270m), a folder or a GGUF file")
    ap.add_argument("--draft", help="with --target: a draft checkpoint (default: a random 1-layer Llama, hidden 128)")
    ap.add_argument("--json", type=Path, help="write the raw measurements here")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.target:
        target, draft, prompt = real_models(args)
    else:
        target = llama(args.vocab, 256, args.target_layers, seed=0)
        draft = llama(args.vocab, 128, 1, seed=1)
        prompt = torch.randint(0, args.vocab, (32,), generator=torch.Generator().manual_seed(0)).tolist()
    marks = (100, args.rounds)
    rows = []
    for mode in args.modes:
        tree = dict(tree=args.tree, children=args.children) if args.tree else {}
        decoder = SpeculativeDecoder(
            target,
            DraftModelProposer(draft, label=args.draft or "random-draft", **tree),
            k=args.k,
            sampling=MODES[mode],
            vectors=args.vectors,
        )
        m = measure(decoder, prompt, args.rounds, marks)
        lo, hi = m["peak_rss_kb"].get(100), m["peak_rss_kb"].get(args.rounds)
        row = {
            "mode": mode,
            "rounds": m["rounds"],
            "tokens": m["tokens"],
            "rss_mb_at_100": lo / 1024 if lo else None,
            "rss_mb_at_end": hi / 1024 if hi else None,
            "growth_kb_per_round": (hi - lo) / (args.rounds - 100) if lo and hi and args.rounds > 100 else None,
            "ms_per_round_50_150": window_ms(m["per_round_s"], 50, 150),
            "ms_per_round_last_100": window_ms(m["per_round_s"], args.rounds - 100, args.rounds),
            # the same windows in process CPU time and in forward time: where a wall ratio
            # comes from (the models' forwards over a longer context, or the machine)
            "cpu_ms_per_round_50_150": window_ms(m["cpu_round_s"], 50, 150),
            "cpu_ms_per_round_last_100": window_ms(m["cpu_round_s"], args.rounds - 100, args.rounds),
            "forward_ms_per_round_50_150": window_ms(m["forward_round_s"], 50, 150),
            "forward_ms_per_round_last_100": window_ms(m["forward_round_s"], args.rounds - 100, args.rounds),
            "steal_jiffies_50_150": m["steal"][149] - m["steal"][49] if len(m["steal"]) >= 150 else None,
            "steal_jiffies_last_100": m["steal"][-1] - m["steal"][-101] if len(m["steal"]) >= 101 else None,
            "bookkeeping_share": m["bookkeeping_share"],
            "wall_s": m["wall_s"],
            # per round: outside the two models' forwards (wall), the whole round in process
            # CPU time, and the decoder's own bookkeeping timer (RoundTimings.bookkeeping_s)
            "bookkeeping_ms_per_round": 1000 * (m["wall_s"] - m["forward_s"]) / m["rounds"],
            "cpu_ms_per_round": 1000 * m["cpu_s"] / m["rounds"],
            "round_bookkeeping_ms": 1000 * m["round_bookkeeping_s"] / m["rounds"],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    if args.markdown:
        print(markdown(rows, args))
    return 0


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    def f(x, fmt):
        return "-" if x is None else format(x, fmt)

    out = [
        f"Vocabulary {args.vocab:,}, k={args.k}, {args.threads} torch threads, {args.rounds} rounds a run, "
        f"vectors={args.vectors}.",
        "",
        "| mode | tokens | peak RSS @100 (MB) | peak RSS @end (MB) | growth (KB/round) | ms/round 50-150 "
        "| ms/round last 100 | ratio | CPU ratio | forwards ms/round (first → last) | bookkeeping share |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def ratio(r: dict, key: str) -> float | None:
        a, b = r.get(key + "_50_150"), r.get(key + "_last_100")
        return b / a if a and b is not None else None

    for r in rows:
        out.append(
            f"| {r['mode']} | {r['tokens']} | {f(r['rss_mb_at_100'], '.0f')} | {f(r['rss_mb_at_end'], '.0f')} "
            f"| {f(r['growth_kb_per_round'], '.1f')} | {f(r['ms_per_round_50_150'], '.1f')} "
            f"| {f(r['ms_per_round_last_100'], '.1f')} | {f(ratio(r, 'ms_per_round'), '.2f')} "
            f"| {f(ratio(r, 'cpu_ms_per_round'), '.2f')} "
            f"| {f(r.get('forward_ms_per_round_50_150'), '.1f')} → {f(r.get('forward_ms_per_round_last_100'), '.1f')} "
            f"| {f(100 * r['bookkeeping_share'], '.1f')}% |"
        )
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())

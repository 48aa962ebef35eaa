"""How the target's verify forward grows with the number of tree nodes (batch 1).

For each node count n: the bundled target with a cached prompt runs one forward over n tree
nodes (a balanced tree, the 4D mask and depth positions, as the decoder's tree branch does),
then the cache is cut back; the median over interleaved repetitions is reported, relative to
n = 1 (a one-token forward: what plain decoding pays per token). Run it on a quiet machine:

    .venv/bin/python scripts/measure_tree_forward.py --threads 2 --reps 30
    .venv/bin/python scripts/measure_tree_forward.py --nodes 1,2,4,8,16,32 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from specscope.core.decode.kv import CachedLM
from specscope.core.decode.layout import masked_feed
from specscope.core.draft.trees import ancestor_matrix, context_and_tree, tree_positions
from specscope.core.loading.models import example_prompts, load_bundled


def balanced_parents(n: int, width: int = 2) -> tuple[int, ...]:
    """n nodes, each parent getting `width` children, breadth first."""
    return tuple(-1 if i < width else (i - width) // width for i in range(n))


def forward_s(lm: CachedLM, prefix_len: int, parents: tuple[int, ...]) -> float:
    allowed = context_and_tree(prefix_len, 0, ancestor_matrix(parents))
    tokens = [7] * len(parents)
    started = time.perf_counter()
    masked_feed(lm, tokens, tree_positions(parents, prefix_len), allowed, keep=len(parents))
    if lm.device.type == "cuda":
        torch.cuda.synchronize(lm.device)
    elapsed = time.perf_counter() - started
    lm.crop(prefix_len)
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="1,2,4,8,16,32", help="comma-separated node counts")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_bundled("small", device=args.device)
    prompt = list(pair.tokenizer(example_prompts()[0].text, add_special_tokens=False)["input_ids"])
    lm = CachedLM(pair.target)
    lm.forward(prompt, keep=1)
    counts = [int(x) for x in args.nodes.split(",")]
    times: dict[int, list[float]] = {n: [] for n in counts}
    for n in counts:  # warm-up
        forward_s(lm, len(prompt), balanced_parents(n))
    for _ in range(args.reps):  # interleaved, so drift hits every size alike
        for n in counts:
            times[n].append(forward_s(lm, len(prompt), balanced_parents(n)))
    base = statistics.median(times[counts[0]])
    rows = [
        {"nodes": n, "median_ms": 1e3 * statistics.median(times[n]), "relative": statistics.median(times[n]) / base}
        for n in counts
    ]
    if args.json:
        print(json.dumps({"threads": torch.get_num_threads(), "prompt_tokens": len(prompt), "rows": rows}, indent=1))
        return
    print(f"target verify forward, batch 1, {torch.get_num_threads()} threads, prompt {len(prompt)} tokens cached")
    print("| nodes | median ms | vs 1 node |\n|---|---|---|")
    for r in rows:
        print(f"| {r['nodes']} | {r['median_ms']:.2f} | {r['relative']:.2f}x |")


if __name__ == "__main__":
    main()

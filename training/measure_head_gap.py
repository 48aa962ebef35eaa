"""Served acceptance against the training measure of a chat target's EAGLE-3 head (issue 41).

For each bundled chat prompt of a kind (resources/prompts/chat.json; always held out of the
head's training), the head drafts greedily through specscope's decoder (chat template on,
chains of k): acceptance by depth = accepted / reached nodes at that depth. Then
training/train_head.py's own measure runs on the same text (cache_answers over prompt +
served answer, the training unroll, head argmax = target argmax given correct inputs up to the
depth), counted two ways: over the answer's positions only (what train_head.py labels now, and
what serving drafts) and over the prompt's positions too (what it labelled before issue 41's
fix: the chat template and the fixed system turn, which the head memorises). Greedy and
deterministic: one repetition suffices; the load average is printed because the seconds are not
results on a shared machine.

    python training/measure_head_gap.py                      # SmolLM2, its shipped head, chat prompts, k=2
    python training/measure_head_gap.py --kind code --k 4 --max-new 64
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_head as th


def measure(target, tok, head_dir: Path, prompt_ids: list[int], k: int, max_new: int, depth: int) -> dict:
    from specscope.core import SamplingConfig, SpeculativeDecoder
    from specscope.core.draft.registry import build_proposer
    from specscope.core.loading.chat import turn_end_id

    eos = turn_end_id(target, tok)
    proposer = build_proposer(f"eagle3:{head_dir}")
    decoder = SpeculativeDecoder(target, proposer, k=k, sampling=SamplingConfig(temperature=0), eos_token_id=eos)
    result = decoder.generate(prompt_ids, max_new)
    reached, accepted = np.zeros(k), np.zeros(k)
    drafted = sum(len(r.nodes) for r in result.rounds)
    for r in result.rounds:
        for n in r.nodes:
            if n.status != "unvisited":
                reached[n.depth - 1] += 1
                accepted[n.depth - 1] += n.status == "accepted"
    answer = list(result.new_tokens)
    layers = proposer.head.feature_layers(int(target.config.get_text_config().num_hidden_layers))
    end = len(prompt_ids) + len(answer)
    cached = th.cache_answers(target, layers, [(prompt_ids, answer)], eos, end, 16, 1)
    with_prompt = replace(cached, valid=cached.valid.clone())
    with_prompt.valid[0, : end - (1 if answer and answer[-1] == eos else 0)] = True  # the labels before the fix
    head = proposer.head.float().eval()
    to_draft = torch.full((head.vocab_size,), -1, dtype=torch.long)
    to_draft[head.draft_to_target] = torch.arange(head.draft_vocab)
    cfg = replace(th.CHAT, depth=depth, batch=1)
    embed = target.get_input_embeddings()
    trained = th.evaluate(head, embed, {"answer": cached, "with-prompt": with_prompt}, cfg, to_draft)
    return {
        "reached": reached,
        "accepted": accepted,
        "drafted": drafted,
        "answer": trained["answer"],
        "with_prompt": trained["with-prompt"],
        "new": len(answer),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="smollm2")
    ap.add_argument("--head", type=Path, default=None, help="default: the target's shipped EAGLE-3 head")
    ap.add_argument("--kind", default="chat", choices=("chat", "summary", "code"))
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--depth", type=int, default=4, help="depths of the training measure")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from specscope.core.loading import CheckpointError, load_model, load_tokenizer, models_dir
    from specscope.core.loading.chat import chat_prompt_ids, chat_prompts

    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    t0 = time.perf_counter()
    try:
        folder = th.target_folder(args.target)
        target = load_model(folder, device="cpu", dtype="float32", role="target")
        tok = load_tokenizer(folder)
    except CheckpointError as exc:
        raise SystemExit(f"measure_head_gap: {exc}") from None
    head_dir = args.head or models_dir() / "eagle3-smollm2"
    reached, accepted, drafted = np.zeros(args.k), np.zeros(args.k), 0
    sums = {"answer": np.zeros(args.depth), "with_prompt": np.zeros(args.depth)}
    counts = {"answer": 0, "with_prompt": 0}
    prompts = [(p.name, p.user, p.system) for p in chat_prompts(args.kind)]
    if args.kind == "chat":  # the prompt (acceptance 0.05 at k=2)
        prompts.append(("sky (issue 41)", "Explain in two sentences why the sky is blue.", None))
    for name, user, system in prompts:
        ids = chat_prompt_ids(tok, user, system)
        m = measure(target, tok, head_dir, ids, args.k, args.max_new, args.depth)
        drafted += m["drafted"]
        reached += m["reached"]
        accepted += m["accepted"]
        for key in sums:
            n = m[key]["positions"]
            sums[key] += np.array(m[key]["accuracy_by_depth"]) * n
            counts[key] += n
        rate = m["accepted"].sum() / max(1, m["drafted"])
        print(
            f"{name}: {m['new']} new tokens; served acceptance (accepted/drafted) {rate:.3f}; "
            f"training measure at depth 0: answer positions {m['answer']['accuracy_by_depth'][0]:.3f} "
            f"({m['answer']['positions']}), with the prompt's {m['with_prompt']['accuracy_by_depth'][0]:.3f} "
            f"({m['with_prompt']['positions']})"
        )
    served = accepted / np.maximum(reached, 1)
    rate = accepted.sum() / max(1, drafted)
    print(f"\n{args.kind} prompts, head {head_dir.name}, greedy, k={args.k}, {args.max_new} new tokens at most")
    print(f"served acceptance rate (accepted / drafted, the CLI's): {rate:.3f}")
    print("served acceptance by depth (accepted / reached):  " + " ".join(f"{v:.3f}" for v in served))
    print("  nodes reached by depth:                        " + " ".join(str(int(v)) for v in reached))
    for key, what in (("answer", "answer positions (train_head.py now)"), ("with_prompt", "prompt + answer (before)")):
        acc = sums[key] / max(1, counts[key])
        print(f"training measure by depth, {what}: " + " ".join(f"{v:.3f}" for v in acc) + f" ({counts[key]})")
    print(f"{time.perf_counter() - t0:.0f} s; load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")


if __name__ == "__main__":
    main()

"""Tokens per target pass of proposer specs on a target's bundled prompts, greedy: what a
proposer's acceptance is, without timing (a greedy run's rounds are the same on any machine,
loaded or quiet).

A chat target (SmolLM2, `--target smollm2`) decodes the bundled chat prompts
(resources/prompts/chat.json) under its chat template and stops at its end of turn; the
bundled target decodes the bundled example prompts. Per spec: accepted tokens + 1 over the
target passes after the prefill, overall and per prompt kind; every spec's output is checked
equal to the first's (greedy output is the target's whatever drafts).

    .venv/bin/python scripts/measure_acceptance.py --target smollm2 eagle3 "eagle3,lookup=3"
    .venv/bin/python scripts/measure_acceptance.py eagle3 draft:small lookup --k 2
"""

from __future__ import annotations

import argparse
import sys

import torch

from specscope.core import SamplingConfig, SpeculativeDecoder
from specscope.core.draft.registry import SpecError, build_proposer, for_target
from specscope.core.loading import example_prompts, load_models
from specscope.core.loading.chat import chat_prompt_ids, chat_prompts, eos_ids


def prompts(target_name: str | None, tokenizer) -> list[tuple[str, list[int]]]:
    """(kind, ids) of the target's bundled prompts: chat prompts under a chat template."""
    if getattr(tokenizer, "chat_template", None):
        return [(p.kind, chat_prompt_ids(tokenizer, p.user, p.system)) for p in chat_prompts()]
    return [(p.kind, tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in example_prompts()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs="+", help="proposer specs, e.g. eagle3 eagle3,lookup=3 draft:small")
    ap.add_argument("--target", default=None, help="a checkpoint or fetched model's name (default: bundled)")
    ap.add_argument("--k", default="4", help="draft length, or auto (default: 4)")
    ap.add_argument("--max-new", type=int, default=64, help="new tokens per prompt (default: 64)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    pair = load_models(target=args.target, draft=None, device="cpu")
    target, tokenizer = pair.target, pair.tokenizer
    eos = eos_ids(target, tokenizer)
    greedy = SamplingConfig(temperature=0)
    k: int | str = args.k if args.k == "auto" else int(args.k)
    cases = prompts(args.target, tokenizer)

    def drafts(ref: str):  # a draft model spec's model (draft:small, draft:smollm2-draft, draft:PATH)
        return load_models(target=args.target, draft=ref, device="cpu").draft, ref

    first: list[list[int]] | None = None
    print(f"target {args.target or 'bundled'}, {len(cases)} prompts, k={k}, {args.max_new} new tokens, greedy")
    for spec in args.specs:
        try:
            proposer = build_proposer(for_target(spec, args.target), load_draft=drafts)
        except SpecError as exc:
            print(f"measure_acceptance: {exc}", file=sys.stderr)
            return 2
        outputs, by_kind = [], {}
        for kind, ids in cases:
            result = SpeculativeDecoder(target, proposer, k=k, sampling=greedy, eos_token_id=eos).generate(
                ids, args.max_new
            )
            outputs.append(list(result.new_tokens))
            rounds = result.rounds[1:]  # after the prefill's round
            made, passes = by_kind.setdefault(kind, [0, 0]), sum(r.target_forwards for r in rounds)
            made[0] += sum(r.accepted_length for r in rounds)
            made[1] += passes
        if first is None:
            first = outputs
        elif outputs != first:
            print(f"measure_acceptance: {spec}'s output differs from {args.specs[0]}'s", file=sys.stderr)
            return 1
        total = [sum(v[i] for v in by_kind.values()) for i in (0, 1)]
        kinds = ", ".join(f"{kind} {made / max(1, passes):.2f}" for kind, (made, passes) in by_kind.items())
        print(f"{spec:44s} tokens per target pass {total[0] / max(1, total[1]):.3f} ({kinds})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Acceptance of the bundled EAGLE-3 head against the bundled drafts, on every bundled example
prompt: mean accepted length per proposer (all prompts, and per prompt kind), and for each
proposer the acceptance at each draft depth given that the depth was tested (accepted /
tested), the number the head's config records as its held-out accuracy per depth
(`specscope.accuracy_by_depth`, measured on its training distribution): where they differ,
the head serves text it was not trained on.

Acceptance does not depend on the machine's speed, so this runs on a loaded machine too
(the bench measures the speed; the decode tokens/s printed here, the tokens after each run's
first round over the wall time after it, is only as good as the machine is quiet). Greedy is
deterministic; T > 0 uses the given seed. `--coupled SEED` couples the lanes
(core.verify.coupling): every proposer's run emits the target's Gumbel picks of (SEED,
position), so all lanes emit the same text wherever their prefixes agree and their acceptance
is measured on the same draws; a draft is then accepted iff it equals the target's pick.

    .venv/bin/python scripts/measure_head.py --threads 1 --k 4 --max-new 128
    .venv/bin/python scripts/measure_head.py --proposers eagle3,draft:small --json
    .venv/bin/python scripts/measure_head.py --proposer eagle3 --proposer "eagle3,tree=dynamic:nodes=16,depth=5,topk=4"
    .venv/bin/python scripts/measure_head.py --proposers eagle3,eagle3:draw=onehot --temperatures 1,0.7 --coupled 0

A tree's "by depth" counts every node tried at that depth (siblings too).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch

from specscope.core.decode.factory import Models, RunSettings, build_decoder
from specscope.core.draft.registry import parse_spec
from specscope.core.loading import bundled_head_path, example_prompts, load_bundled


def measure(
    models: Models, spec: str, prompts, k: int, max_new: int, temperature: float, seed: int, coupled: int | None = None
) -> dict:
    """Rounds that drafted, over every prompt: accepted lengths by kind, tested and accepted by
    depth; decode tokens/s (after each run's first round); each prompt's output tokens."""
    settings = RunSettings(
        proposer=spec, k=k, temperature=temperature, seed=seed, max_new_tokens=max_new, coupling_seed=coupled
    )
    decoder = build_decoder(settings, models)
    lengths: dict[str, list[int]] = defaultdict(list)
    tested: dict[int, int] = defaultdict(int)
    accepted: dict[int, int] = defaultdict(int)
    outputs: list[list[int]] = []
    decode_tokens, decode_wall = 0, 0.0
    for prompt in prompts:
        ids = models.tokenizer(prompt.text, add_special_tokens=False)["input_ids"]
        rounds, first_round_end = [], []

        def keep(rnd):  # called while this prompt's run drains, so its lists are the right ones
            rounds.append(rnd)  # noqa: B023
            if not first_round_end:  # noqa: B023
                first_round_end.append(time.perf_counter())  # noqa: B023

        result = decoder.start(ids, max_new).drain(keep)  # the result keeps no rounds
        if rounds:
            decode_wall += time.perf_counter() - first_round_end[0]
            decode_tokens += len(result.new_tokens) - len(rounds[0].emitted)
        outputs.append(list(result.new_tokens))
        for rnd in rounds:
            if not rnd.nodes:
                continue
            hits = [n.status for n in rnd.nodes].count("accepted")
            lengths[prompt.kind].append(hits + 1)
            for node in rnd.nodes:
                if node.status in ("accepted", "rejected"):
                    tested[node.depth] += 1
                    accepted[node.depth] += node.status == "accepted"
    every = [n for values in lengths.values() for n in values]
    return {
        "mean_accepted_length": round(sum(every) / len(every), 3),
        "rounds": len(every),
        "by_kind": {kind: round(sum(v) / len(v), 3) for kind, v in lengths.items()},
        "acceptance_by_depth": [
            round(accepted[d] / tested[d], 3) if tested[d] else None for d in range(1, max(tested, default=0) + 1)
        ],
        "tested_by_depth": [tested[d] for d in range(1, max(tested, default=0) + 1)],
        "acceptance_rate": round(sum(accepted.values()) / (len(every) * k), 3) if every else None,
        "decode_tokens_per_s": round(decode_tokens / decode_wall, 1) if decode_wall else None,
        "outputs": outputs,
    }


def mode_name(temperature: float) -> str:
    return "greedy" if temperature == 0 else f"T={temperature:g}"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--proposers", default="eagle3,draft:small,draft:tiny", help="comma-separated specs without commas")
    ap.add_argument(
        "--proposer",
        action="append",
        default=None,
        metavar="SPEC",
        help="one spec (a tree's has commas); repeat for several; replaces --proposers",
    )
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--temperatures", default="0,1", help="comma-separated; 0 = greedy (default: 0,1)")
    ap.add_argument("--coupled", type=int, default=None, metavar="SEED", help="couple the lanes at T > 0")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    pair = load_bundled("small", device="cpu")
    drafts = {"small": pair.draft, "tiny": load_bundled("tiny", device="cpu").draft}
    prompts = example_prompts()
    record = json.loads((bundled_head_path("eagle3-target") / "config.json").read_text())["specscope"]
    out = {
        "k": args.k,
        "max_new": args.max_new,
        "prompts": [p.name for p in prompts],
        "coupled": args.coupled,
        "head_accuracy_by_depth": record["accuracy_by_depth"],
        "modes": {},
    }
    for temperature in (float(t) for t in args.temperatures.split(",")):
        mode, rows = mode_name(temperature), {}
        for spec in args.proposer or args.proposers.split(","):
            parsed = parse_spec(spec)
            name = parsed.arg if parsed.kind == "draft" else None
            models = Models(pair.target, draft=drafts.get(name), draft_name=name, tokenizer=pair.tokenizer)
            rows[spec] = measure(
                models,
                spec,
                prompts,
                args.k,
                args.max_new,
                temperature,
                args.seed,
                None if temperature == 0 else args.coupled,
            )
            # the lanes' outputs against the first proposer's, prompt by prompt
            first = next(iter(rows.values()))["outputs"]
            rows[spec]["same_output_as_first"] = sum(a == b for a, b in zip(first, rows[spec]["outputs"]))
            if not args.json:
                shown = {key: value for key, value in rows[spec].items() if key != "outputs"}
                print(f"{mode} {spec}: {json.dumps(shown)}", flush=True)
        out["modes"][mode] = rows
    if args.json:
        print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()

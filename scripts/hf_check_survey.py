"""Check transformers' own speculative decoding with specscope's checker, over many runs.

Runs the transformers engine (assisted and prompt lookup; greedy, T=1 and T=0.8/top-k 8/
top-p 0.9; with and without an EOS token) on random-init models of three architectures
(tests/tiny_models.py) and, with --bundled, on the bundled target + draft-small. Every run's
tokens are compared with the same generate() call unrecorded; every run is checked; the
findings are counted by rule and message, with one reproducible example each.

    python scripts/hf_check_survey.py --prompts 6 [--bundled] [--json]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specscope.core import SamplingConfig
from specscope.core.check.checker import check_report
from specscope.core.engines import TransformersEngine

SAMPLERS = (
    SamplingConfig(temperature=0.0),
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.8, top_k=8, top_p=0.9),
)


def random_prompts(n: int, vocab: int) -> list[list[int]]:
    out = []
    for i in range(n):
        rng = random.Random(i)
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(2, 12))]
        out.append(prompt + prompt if i % 2 else prompt)
    return out


def survey(label: str, target, draft, prompts, eos_ids, max_new: int, tally: dict) -> None:
    for sampling in SAMPLERS:
        for kind in ("assisted", "lookup"):
            for eos in eos_ids:
                engine = TransformersEngine(target, kind=kind, draft=draft, k=4, sampling=sampling, eos_token_id=eos)
                for seed, prompt in enumerate(prompts):
                    where = dict(
                        models=label,
                        kind=kind,
                        sampling=sampling.describe(),
                        eos=eos,
                        seed=seed,
                        prompt=prompt,
                        max_new=max_new,
                    )
                    result = engine.generate(prompt, max_new, seed=seed)
                    tally["runs"] += 1
                    tally["rounds"] += len(result.rounds)
                    if result.new_tokens != engine.plain_generate(prompt, max_new, seed=seed):
                        tally["mismatches"].append(where)
                    for f in check_report(result.config, result.rounds).findings:
                        key = f"{f.rule}: {f.message.split(':')[0].rstrip('0123456789 ')}"
                        tally["findings"][key] += 1
                        tally["examples"].setdefault(key, dict(where, finding=str(f)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-new", type=int, default=24)
    ap.add_argument("--bundled", action="store_true", help="also the bundled target + draft-small")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from tests.tiny_models import ARCHITECTURES, noisy_copy, tiny_lm

    tally = {"runs": 0, "rounds": 0, "mismatches": [], "findings": collections.Counter(), "examples": {}}
    for arch in ARCHITECTURES:
        target = tiny_lm(arch, seed=0, init_range=0.3)
        survey(
            f"tiny {arch} + noisy_copy(0.5)",
            target,
            noisy_copy(target, 0.5),
            random_prompts(args.prompts, 64),
            (None, 7),
            args.max_new,
            tally,
        )
    if args.bundled:
        from specscope.core.loading.models import example_prompts, load_bundled

        pair = load_bundled("small", device="cpu")
        prompts = [list(pair.tokenizer(p.text, add_special_tokens=False)["input_ids"]) for p in example_prompts()]
        survey(
            "bundled target + draft-small",
            pair.target,
            pair.draft,
            prompts[: args.prompts],
            (pair.tokenizer.eos_token_id,),
            2 * args.max_new,
            tally,
        )
    if args.json:
        print(json.dumps(tally, indent=2, default=str))
        return 0
    print(f"{tally['runs']} runs, {tally['rounds']} rounds, {len(tally['mismatches'])} recorded != unrecorded")
    for key, count in tally["findings"].most_common():
        print(f"{count:5d}  {key}\n       e.g. {tally['examples'][key]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

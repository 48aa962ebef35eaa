"""specscope's verify forward against transformers' bare forward over the same positions.

Issue 41: the target forward that verifies n positions (the pending token and n - 1 drafts)
must cost within 5% of the model's own forward over those positions. For each n = 2..9 the
script times, on the same model and the same cache length (a prompt of --context tokens
prefilled once into each cache):

    specscope     CachedLM.feed(ids, keep=n), as ChainLayout.forward calls it: the list of
                  ids turned into a tensor, the position ids, the growing KV cache
                  (core.decode.kv.GrowingLayer), logits_to_keep, the float32 logits view
    transformers  model(input_ids=ids, cache=DynamicCache, use_cache=True): the ids tensor
                  built beforehand, transformers' own cache, logits of every fed position

Both run under torch.inference_mode. After each timed call the cache is cropped back to the
context (untimed), so every repetition verifies at the same cache length. The two are
interleaved, the order alternating every repetition; the ratio is taken per repetition
(paired: the same machine state) and its median reported, with min-max. Prints the load
average before and after: timings on a busy machine are not results (`--clock cpu
--threads 1` times the calling thread's CPU instead, for a look on a shared machine).

    .venv/bin/python scripts/measure_verify_forward.py --threads 2 --reps 31        # bundled target
    .venv/bin/python scripts/measure_verify_forward.py --scale --threads 2 --reps 21  # random 2-layer, 151,936 tokens
    .venv/bin/python scripts/measure_verify_forward.py --target smollm2 --context 100 --n 1 2 3 5 --reps 9

Both run the model as load_model makes it: on a CPU in float32 its linear layers go through
core.kernels.few_rows for 1-8 positions. `--kernel off` times PyTorch's own F.linear instead (the
layers switched back); `--kernel both` prints the two tables, each interleaved as above.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import DynamicCache

sys.path.insert(0, str(Path(__file__).resolve().parent))


def load_target(args: argparse.Namespace) -> torch.nn.Module:
    if args.scale:
        from profile_decoder import random_llama

        return random_llama(args.vocab, 256, 2, seed=0)
    from specscope.core.loading import models as loading

    if args.target:  # a fetched model's name (smollm2) or a checkpoint folder, float32 as specscope runs it
        from specscope.core.loading import load_model
        from specscope.core.loading.errors import CheckpointError

        try:
            return load_model(args.target, device="cpu", dtype="float32", role="target")
        except CheckpointError as exc:
            raise SystemExit(f"measure_verify_forward: {exc}") from None
    return loading.load_bundled("small", device="cpu").target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", action="store_true", help="a random 2-layer hidden-256 Llama with --vocab tokens")
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--target", help="a fetched model's name (smollm2) or a checkpoint folder (default: bundled)")
    ap.add_argument("--context", type=int, default=64, help="tokens in the cache before each verify forward")
    ap.add_argument("--reps", type=int, default=31)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the calling thread's CPU time (with --threads 1 a busy machine's waiting drops out)",
    )
    ap.add_argument("--n", type=int, nargs="+", default=list(range(2, 10)), help="positions per verify forward")
    ap.add_argument(
        "--kernel",
        choices=("on", "off", "both"),
        default="on",
        help="the few-row linear kernel (core.kernels): on as load_model installs it, off = F.linear, both",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from specscope.core import kernels

    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; torch threads {torch.get_num_threads()}")
    print(f"few-row kernel: {kernels.kernel_status()}")
    model = load_target(args)
    worst = 0.0
    for setting in ("on", "off") if args.kernel == "both" else (args.kernel,):
        if setting == "on":
            kernels.install(model)
        else:
            kernels.remove(model)
        print(f"-- kernel {setting}: {'few_rows' if kernels.installed(model) else 'F.linear'}")
        worst = max(worst, _table(model, args))
    print(f"largest median ratio {worst:.3f} (target <= 1.05)")
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} at the end")
    return 0


def _table(model: torch.nn.Module, args: argparse.Namespace) -> float:
    """Prints one table of specscope's against transformers' forward; the largest median ratio."""
    from specscope.core.decode.kv import CachedLM

    vocab = model.get_output_embeddings().weight.shape[0]
    gen = torch.Generator().manual_seed(0)
    context = torch.randint(0, vocab, (args.context,), generator=gen).tolist()
    fed = torch.randint(0, vocab, (max(args.n),), generator=gen).tolist()

    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    lm = CachedLM(model)
    lm.feed(context, keep=1)
    bare = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([context]), cache=bare, use_cache=True, logits_to_keep=1)

    def crop_bare() -> None:  # transformers' crop takes the number of tokens to drop, negated
        excess = bare.get_seq_length() - args.context
        if excess > 0:
            bare.crop(-excess)

    def ours(n: int) -> float:
        started = clock()
        lm.feed(fed[:n], keep=n)
        took = clock() - started
        lm.crop(args.context)
        return took

    def theirs(n: int, ids: torch.Tensor) -> float:
        with torch.inference_mode():
            started = clock()
            model(input_ids=ids, cache=bare, use_cache=True)
            took = clock() - started
        crop_bare()
        return took

    ids_of = {n: torch.tensor([fed[:n]]) for n in args.n}
    with torch.inference_mode():  # the same logits from both (a wrong cache would show here)
        for n in (min(args.n), max(args.n)):
            a = lm.feed(fed[:n], keep=n)
            b = model(input_ids=ids_of[n], cache=bare, use_cache=True).logits[0].float()
            lm.crop(args.context)
            crop_bare()
            if not torch.allclose(a, b, atol=1e-4, rtol=1e-4):
                raise SystemExit(f"n={n}: the two forwards' logits differ (max {float((a - b).abs().max()):.2e})")
    for n in args.n:  # warm-up
        ours(n), theirs(n, ids_of[n])
    print(f"{'n':>3}{'specscope ms':>14}{'transformers ms':>17}{'ratio (median of pairs)':>26}{'min-max':>16}")
    worst = 0.0
    for n in args.n:
        a_times, b_times, ratios = [], [], []
        for rep in range(args.reps):
            if rep % 2 == 0:
                a, b = ours(n), theirs(n, ids_of[n])
            else:
                b, a = theirs(n, ids_of[n]), ours(n)
            a_times.append(a)
            b_times.append(b)
            ratios.append(a / b)
        ratio = statistics.median(ratios)
        worst = max(worst, ratio)
        print(
            f"{n:>3}{1e3 * statistics.median(a_times):>14.3f}{1e3 * statistics.median(b_times):>17.3f}"
            f"{ratio:>26.3f}{min(ratios):>8.3f}-{max(ratios):.3f}"
        )
    return worst


if __name__ == "__main__":
    sys.exit(main())

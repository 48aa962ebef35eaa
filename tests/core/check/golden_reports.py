"""The checker's full report on a fixed set of runs, for a before/after comparison of the checker.

Cases: every fault that any run takes (core.faults.zoo: chain faults, stop faults, tree faults,
the coupled fault) in greedy and sampled runs, clean chain, lookup, stop, coupled and tree runs,
the same runs saved top-N only and read back from a store (partial records), and chain rounds
tampered one field at a time (each finer chain rule: acceptance-draw, greedy, residual, draw,
sampler, round-structure). Each case's report is every finding (rule, severity, round, position,
node, message) and the not-checked list.

    python -m tests.core.check.golden_reports OUT.json     write the reports
    python -m tests.core.check.golden_reports --diff A.json B.json
    python -m tests.core.check.golden_reports --save-cases CASES.pkl
    python -m tests.core.check.golden_reports --cases CASES.pkl [--check-dir DIR] OUT.json

Record the reports of the code before a refactor of the checker, then diff them with the
reports after it: the refactor must not change what the checker says (issue 39's one proof).
The runs take most of the time and do not depend on the checker: save them once
(--save-cases) and check the same cases with each side; --check-dir puts another revision's
core/check in place of this checkout's (`git archive REV core/check | tar -x -C DIR`, then
DIR/core/check), as scripts/time_check.py does.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

GOLDEN = Path(__file__).parent / "golden" / "reports.json"
SETTINGS = [
    ("greedy", dict(temperature=0)),
    ("t1", dict(temperature=1.0)),
    ("topk8", dict(temperature=1.0, top_k=8)),
    ("topp09", dict(temperature=0.8, top_p=0.9)),
]
PROMPTS = [[1, 2, 3, 4], [9, 8, 7], [5, 17, 5, 17, 5]]
TREES = [("3,2,1", "topk"), ("3,2,1", "sampled"), ("2,2,2", "distinct"), ("dynamic:nodes=10,depth=4,topk=3", "topk")]
EOS = 11


def _report(config: Any, rounds: Any, end: Any = None) -> tuple[Any, list[Any], Any]:
    """One case: what the checker is given (the report is taken later, by `check`)."""
    return config, list(rounds), end


def check(cases: dict[str, tuple[Any, list[Any], Any]]) -> dict[str, Any]:
    """Every case's report: every finding and the not-checked list."""
    from specscope.core.check.checker import check_report

    out = {}
    for key, (config, rounds, end) in cases.items():
        report = check_report(config, rounds, end=end)
        out[key] = {
            "findings": [f.to_dict() for f in report.findings],
            "not_checked": dict(sorted(report.not_checked.items())),
        }
    return out


def _tampered(rounds: list[Any], greedy: bool) -> Iterator[tuple[str, list[Any]]]:
    """Chain rounds with one field changed, each where it applies first."""

    def first(want: Callable[[Any], bool]) -> int | None:
        return next((i for i, r in enumerate(rounds) if want(r)), None)

    def at(i: int | None, rnd: Any) -> list[Any]:
        assert i is not None
        return rounds[:i] + [rnd] + rounds[i + 1 :]

    def node(r: Any, j: int, **changes: Any) -> Any:
        nodes = list(r.nodes)
        nodes[j] = dataclasses.replace(nodes[j], **changes)
        return dataclasses.replace(r, nodes=tuple(nodes))

    def emitted(r: Any, kind: str, **changes: Any) -> Any:
        return dataclasses.replace(
            r, emitted=tuple(dataclasses.replace(e, **changes) if e.kind == kind else e for e in r.emitted)
        )

    i = first(lambda r: any(n.status == "accepted" for n in r.nodes))
    if i is not None:
        r = rounds[i]
        if greedy:
            yield "argmax-moved", at(i, node(r, 0, target_argmax=(r.nodes[0].token + 1) % 64))
        else:
            yield "u-too-large", at(i, node(r, 0, u=0.9999999))
        yield "p-token-off", at(i, node(r, 0, p_token=float(r.nodes[0].p_token or 0) + 0.125))
        if not greedy:
            yield "q-token-zero", at(i, node(r, 0, q_token=0.0))
    i = first(lambda r: r.rejected_node is not None)
    if i is not None:
        r = rounds[i]
        j = r.rejected_node
        if not greedy:
            yield "u-zero-on-rejected", at(i, node(r, j, u=0.0))
        rep = next(e for e in r.emitted if e.kind == "repaired")
        yield "repair-token", at(i, emitted(r, "repaired", token=(rep.token + 1) % 64))
        yield (
            "repair-dropped",
            at(i, dataclasses.replace(r, emitted=tuple(e for e in r.emitted if e.kind != "repaired"))),
        )
        if not greedy:
            yield "repair-draw-none", at(i, emitted(r, "repaired", draw=None))
            yield "repair-draw-one", at(i, emitted(r, "repaired", draw=0.999999))
            if r.residual_mass is not None:
                yield "residual-mass", at(i, dataclasses.replace(r, residual_mass=r.residual_mass + 0.01))
            if r.residual is not None:
                res = np.asarray(r.residual, dtype=np.float64)
                flat = np.full_like(res, 1.0 / res.shape[-1])
                yield "residual-flat", at(i, dataclasses.replace(r, residual=flat))
                yield "residual-none", at(i, dataclasses.replace(r, residual=None))
            yield "q-none-on-rejected", at(i, node(r, j, q=None))
    i = first(lambda r: any(e.kind == "bonus" for e in r.emitted))
    if i is not None:
        r = rounds[i]
        b = next(e for e in r.emitted if e.kind == "bonus")
        yield "bonus-token", at(i, emitted(r, "bonus", token=(b.token + 1) % 64))
        yield "bonus-dropped", at(i, dataclasses.replace(r, emitted=tuple(e for e in r.emitted if e.kind != "bonus")))
        yield "bonus-withheld-flag", at(i, dataclasses.replace(r, bonus_withheld=not r.bonus_withheld))
        if not greedy:
            yield "bonus-p-none", at(i, dataclasses.replace(r, bonus_p=None))
            yield "bonus-draw-one", at(i, emitted(r, "bonus", draw=0.999999))
    i = first(lambda r: len(r.nodes) > 1 and r.nodes[1].status != "unvisited")
    if i is not None:
        r = rounds[i]
        yield "status-flipped", at(i, node(r, 0, status="rejected" if r.nodes[0].status == "accepted" else "accepted"))
        yield "unvisited-second", at(i, node(r, 1, status="unvisited"))


def _store_roundtrip(store: Any, decoder: Any, prompt: list[int], max_new: int, seed: int) -> tuple[Any, list[Any]]:
    from specscope.storage import TraceWriter

    config = decoder.run_config(prompt, max_new, seed=seed)
    with TraceWriter(store, config, full_vectors=False, top_n=8) as writer:
        writer.record(decoder.rounds(prompt, max_new, config=config))
    return store.run_config(config.run_id), store.load_rounds(config.run_id, full=True)


def cases() -> dict[str, tuple[Any, list[Any], Any]]:
    import torch

    from specscope.core import DraftModelProposer, PromptLookupProposer, SamplingConfig, SpeculativeDecoder
    from specscope.core.decode.stops import Stops
    from specscope.core.faults.zoo import FAULTS, faulty_decoder
    from specscope.storage import TraceStore
    from tests.tiny_models import noisy_copy, tiny_lm

    torch.manual_seed(0)
    target = tiny_lm("llama", vocab=64, seed=0, init_range=0.3)
    close, far = noisy_copy(target, 0.08), noisy_copy(target, 0.3)
    out: dict[str, Any] = {}
    chain_faults = [name for name, f in FAULTS.items() if not f.needs]
    tmp = tempfile.TemporaryDirectory()
    store = TraceStore(Path(tmp.name) / "golden.sqlite")
    try:
        for sname, kw in SETTINGS:
            cfg = SamplingConfig(**kw)  # type: ignore[arg-type]
            greedy = cfg.greedy
            for eos in (None, EOS):

                def make(fault: str, cfg: Any = cfg, eos: int | None = eos) -> Any:
                    if fault == "clean":
                        return SpeculativeDecoder(target, DraftModelProposer(far), k=4, sampling=cfg, eos_token_id=eos)
                    return faulty_decoder(fault, target, DraftModelProposer(far), k=4, sampling=cfg, eos_token_id=eos)

                for fault in ["clean", *chain_faults]:
                    mname = fault if fault == "clean" else f"fault-{fault}"
                    dec = make(fault)
                    for seed in range(2):
                        for max_new in (13, 30):
                            key = f"chain/{mname}/{sname}/eos{eos}/s{seed}/n{max_new}"
                            prompt = PROMPTS[seed % len(PROMPTS)]
                            res = dec.generate(prompt, max_new, seed=seed)
                            out[key] = _report(res.config, res.rounds)
                            if mname == "clean" and seed == 0:
                                for tname, rounds in _tampered(list(res.rounds), greedy):
                                    out[f"{key}/tamper-{tname}"] = _report(res.config, rounds)
                            if max_new == 30 and (mname == "clean" or seed == 0):
                                config, rounds = _store_roundtrip(store, dec, prompt, max_new, seed)
                                out[f"{key}/topn"] = _report(config, rounds)
                                if mname == "clean" and seed == 0:
                                    for tname, tr in _tampered(list(rounds), greedy):
                                        out[f"{key}/topn/tamper-{tname}"] = _report(config, tr)
            # lookup and close-draft runs
            dec = SpeculativeDecoder(target, PromptLookupProposer(), k=3, sampling=cfg)
            for seed, prompt in enumerate(PROMPTS):
                res = dec.generate(prompt * 3, 25, seed=seed)
                out[f"lookup/{sname}/s{seed}"] = _report(res.config, res.rounds)
            dec = SpeculativeDecoder(target, DraftModelProposer(close), k=4, sampling=cfg, eos_token_id=EOS)
            for seed, prompt in enumerate(PROMPTS):
                res = dec.generate(prompt, 30, seed=seed)
                out[f"close/{sname}/s{seed}"] = _report(res.config, res.rounds)
            # stop runs (clean and each stop fault), token-sequence stops
            plain = SpeculativeDecoder(target, DraftModelProposer(far), k=4, sampling=cfg).generate(
                [1, 2, 3, 4], 30, seed=0
            )
            toks = list(plain.new_tokens)
            stops = Stops(sequences=(tuple(toks[6:8]), tuple(toks[20:21])))
            for fname in ["clean"] + [
                name for name, f in FAULTS.items() if f.needs == "stops" and name != "stop-per-token"
            ]:
                for seed in range(3):
                    if fname == "clean":
                        dec = SpeculativeDecoder(target, DraftModelProposer(far), k=4, sampling=cfg, stops=stops)
                    else:
                        dec = faulty_decoder(fname, target, DraftModelProposer(far), k=4, sampling=cfg, stops=stops)
                    for max_new in (8, 21, 30):
                        res = dec.generate([1, 2, 3, 4], max_new, seed=seed)
                        out[f"stops/{fname}/{sname}/s{seed}/n{max_new}"] = _report(res.config, res.rounds)
            # coupled runs
            for fname in ("clean", "coupled-draft-pick"):
                for seed in range(2):
                    if fname == "clean":
                        dec = SpeculativeDecoder(target, DraftModelProposer(far), k=3, sampling=cfg, coupling_seed=7)
                    else:
                        dec = faulty_decoder(fname, target, DraftModelProposer(far), k=3, sampling=cfg, coupling_seed=7)
                    res = dec.generate(PROMPTS[seed], 24, seed=seed)
                    out[f"coupled/{fname}/{sname}/s{seed}"] = _report(res.config, res.rounds)
            # tree runs (clean and each tree fault), in memory and top-N from the store
            if sname == "topp09":
                continue
            tree_faults = [name for name, f in FAULTS.items() if f.needs == "tree"]
            for tree, children in TREES:
                for fname in ["clean"] + tree_faults:
                    prop = DraftModelProposer(far, tree=tree, children=children)
                    if fname == "clean":
                        dec = SpeculativeDecoder(target, prop, sampling=cfg, eos_token_id=EOS)
                    else:
                        dec = faulty_decoder(fname, target, prop, sampling=cfg, eos_token_id=EOS)
                    for seed in range(2):
                        key = f"tree/{tree}/{children}/{fname}/{sname}/s{seed}"
                        res = dec.generate(PROMPTS[seed], 24, seed=seed)
                        out[key] = _report(res.config, res.rounds)
                        if seed == 0:
                            config, rounds = _store_roundtrip(store, dec, PROMPTS[seed], 24, seed)
                            out[f"{key}/topn"] = _report(config, rounds)
    finally:
        store.close()
        tmp.cleanup()
    return out


_NUMBER = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?|\d+e[-+]?\d+")


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    """A report with its messages' decimal numbers masked (their last digits may differ between CPUs)."""
    findings = [{**f, "message": _NUMBER.sub("#", f["message"])} for f in report["findings"]]
    return {"findings": findings, "not_checked": report["not_checked"]}


def diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            lines.append(f"{key}: only in {'first' if key in a else 'second'}")
            continue
        if a[key] == b[key]:
            continue
        fa, fb = a[key]["findings"], b[key]["findings"]
        for f in fa:
            if f not in fb:
                lines.append(f"{key}: - {f['rule']} r{f['round']} p{f['position']} n{f['node']}: {f['message']}")
        for f in fb:
            if f not in fa:
                lines.append(f"{key}: + {f['rule']} r{f['round']} p{f['position']} n{f['node']}: {f['message']}")
        if fa != fb and sorted(map(json.dumps, fa)) == sorted(map(json.dumps, fb)):
            lines.append(f"{key}: same findings, other order")
        na, nb = a[key]["not_checked"], b[key]["not_checked"]
        for rule in sorted(set(na) | set(nb)):
            if na.get(rule) != nb.get(rule):
                lines.append(f"{key}: not_checked[{rule}]: {na.get(rule)!r} -> {nb.get(rule)!r}")
    return lines


def main(argv: list[str]) -> int:
    if argv[:1] == ["--diff"]:
        a, b = (json.loads(Path(p).read_text()) for p in argv[1:3])
        lines = diff(a, b)
        print("\n".join(lines) if lines else "identical")
        return 1 if lines else 0
    if argv[:1] == ["--save-cases"]:
        import pickle

        made = cases()
        Path(argv[1]).write_bytes(pickle.dumps(made))
        print(f"{len(made)} cases")
        return 0
    if argv[:1] == ["--cases"]:
        import pickle

        made = pickle.loads(Path(argv[1]).read_bytes())
        argv = argv[2:]
        if argv[:1] == ["--check-dir"]:
            import specscope.core.check as package

            package.__path__[:] = [argv[1]]  # the other revision's modules under the same names
            argv = argv[2:]
    else:
        made = cases()
    data = check(made)
    Path(argv[0] if argv else GOLDEN).write_text(json.dumps(data, indent=0, sort_keys=True) + "\n")
    n = sum(len(r["findings"]) for r in data.values())
    print(f"{len(data)} cases, {n} findings")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A speculative decoder of another design, in plain numpy, that writes specscope JSONL traces
by hand (raw JSON lines, no specscope code involved in deciding anything): the adversarial
generator of tests/storage/jsonl/test_foreign_traces.py.

A bigram target and a noisy bigram draft over a small vocabulary. Chains and token trees
(static specs with sampled, distinct or top-k children, and a dynamic tree), greedy or
sampled, with EOS, stop token sequences, stop strings (each token's text from a fake
tokenizer) and the budget. Sampled repairs and bonuses are drawn by inverse CDF in token-id
order from a recorded uniform, so every draw is in the trace. Distributions are written as
full vectors or as top-N lists (with or without the whole-vector facts).

`generate(setup)` returns the trace's lines as dicts carrying every optional field this
decoder knows; `strip(lines, names)` leaves out the named optional fields, as a decoder that
does not record them would.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

V = 32
PROMPT = [1, 2, 3]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def piece(token: int) -> str:
    """The fake tokenizer's text of a token: one to two letters, so strings span tokens."""
    return LETTERS[token % 26] * (1 + token % 2)


@dataclass(frozen=True)
class Setup:
    name: str
    greedy: bool = False
    tree: str | None = None  # None: a chain; else a static spec ("2,1") or "dynamic:nodes=..,depth=..,topk=.."
    children: str = "sampled"  # sampled | distinct | topk
    k: int = 3
    max_new: int = 24
    vectors: str = "full"  # full | top (top-N with the whole-vector facts) | top-bare (top-N only)
    top_n: int = 4
    eos: int | None = None
    stop_ids: tuple[tuple[int, ...], ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int = 0
    temperature: float = 1.0
    position_limit: int | None = 200
    # a bug of this decoder: eos-leak / stop-leak (the end is checked only after the round),
    # budget-overshoot (k and the bonus ignore the budget), repair-from-p (the repair drawn from
    # p, the residual still recorded), with-replacement (distinct children drawn i.i.d.),
    # end-ignored (EOS and stops never end the output: the run goes on to the budget)
    bug: str | None = None
    adaptive: bool = False  # a chain drafts 0..k tokens a round (it may draft none: the target's token alone)
    top_k: int = 0  # the sampler's top-k filter on p and q (0: off)
    depth_first: bool = False  # a static tree's nodes numbered depth first (each subtree after its root)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def inverse_cdf(dist: np.ndarray, u: float) -> int:
    """The token u selects in token-id order: CDF(t - 1) <= u * sum < CDF(t)."""
    cdf = np.cumsum(dist)
    t = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    while dist[min(t, len(dist) - 1)] <= 0 and t > 0:  # rounding at the very end of the CDF
        t -= 1
    return min(t, len(dist) - 1)


def residual(p: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, float]:
    r = np.maximum(p - q, 0.0)
    mass = float(r.sum())
    return r / mass, mass


class Models:
    def __init__(self, seed: int, temperature: float, top_k: int = 0):
        rng = np.random.default_rng(100 + seed)
        self.t = rng.normal(size=(V, V)) * 2.0
        self.d = self.t + rng.normal(size=(V, V)) * 1.2
        self.temperature = temperature
        self.top_k = top_k

    def _filtered(self, logits: np.ndarray) -> np.ndarray:
        d = _softmax(logits / (self.temperature or 1.0))
        if self.top_k:
            d[np.argsort(-d, kind="stable")[self.top_k :]] = 0.0
            d /= d.sum()
        return d

    def p(self, last: int) -> np.ndarray:
        return self._filtered(self.t[last])

    def q(self, last: int) -> np.ndarray:
        return self._filtered(self.d[last])


def dist_obj(d: np.ndarray, setup: Setup) -> dict:
    """A distribution object of the format: the full vector, or its top-N (ties by id)."""
    d = np.asarray(d, dtype=np.float64)
    if setup.vectors == "full":
        return {"full": [float(x) for x in d]}
    order = sorted(np.flatnonzero(d > 0).tolist(), key=lambda i: (-d[i], i))[: setup.top_n]
    obj: dict[str, Any] = {"top_ids": order, "top_probs": [float(d[i]) for i in order]}
    if setup.vectors == "top":
        pos = d[d > 0]
        obj.update(support=int(pos.size), minimum=float(d.min()), total=float(d.sum()))
    return obj


def _in_top(d: np.ndarray, token: int, setup: Setup) -> bool:
    if setup.vectors == "full":
        return True
    order = sorted(np.flatnonzero(d > 0).tolist(), key=lambda i: (-d[i], i))[: setup.top_n]
    return token in order


# --------------------------------------------------------------------------- tree shapes


def static_slots(spec: str) -> list[int]:
    """Parents of a branching spec "B1,B2,...": B1 children of the prefix, B2 under each, ..."""
    parents: list[int] = []
    frontier = [-1]
    for b in (int(x) for x in spec.split(",")):
        nxt = []
        for f in frontier:
            for _ in range(b):
                parents.append(f)
                nxt.append(len(parents) - 1)
        frontier = nxt
    return parents


def dynamic_opts(spec: str) -> dict[str, int]:
    return {k: int(v) for k, v in (kv.split("=") for kv in spec.split(":", 1)[1].split(","))}


def depth_of(parents: list[int]) -> list[int]:
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return depth


# --------------------------------------------------------------------------- the decoder


@dataclass
class Ender:
    """The output's end: EOS first, then the first stop string, then the first sequence."""

    setup: Setup
    tokens: list[int] = field(default_factory=list)
    text: str = ""

    first: tuple[str, int] | None = None  # the first end met (kept by a leaking decoder)
    at: int = -1  # its position in the round

    def push(self, token: int) -> tuple[str, int] | None:
        """The end `token` completes; a leaking decoder gets None and goes on (the end is
        kept in `first` and reported after the round)."""
        reason = self._push(token)
        if self.setup.bug == "end-ignored":  # the decoder never looks for an end: it runs to the budget
            return None
        if reason is not None and self.first is None and self.setup.bug in ("eos-leak", "stop-leak"):
            self.first, self.at = reason, self.n_round
        self.n_round += 1
        return None if self.setup.bug in ("eos-leak", "stop-leak") else reason

    n_round: int = 0

    def round_end(self) -> tuple[tuple[str, int] | None, int]:
        """(the end a leaking decoder met this round, its position); resets the round."""
        first, at = self.first, self.at
        self.first, self.at, self.n_round = None, -1, 0
        return first, at

    def _push(self, token: int) -> tuple[str, int] | None:
        self.tokens.append(token)
        before = self.text
        self.text += piece(token)
        if self.setup.eos is not None and token == self.setup.eos:
            return ("eos", 0)
        for i, s in enumerate(self.setup.stop_strings):
            if s in self.text and s not in before:
                return ("text", i)
        for i, seq in enumerate(self.setup.stop_ids):
            if tuple(self.tokens[-len(seq) :]) == seq:
                return ("ids", i)
        return None


def generate(setup: Setup) -> list[dict]:
    models = Models(setup.seed, setup.temperature, setup.top_k)
    rng = random.Random(setup.seed)
    out = list(PROMPT)
    ender = Ender(setup)
    lines: list[dict] = [_header(setup)]
    ended: str | None = None
    cache_after = 0
    index = 0
    while ended is None and len(out) - len(PROMPT) < setup.max_new:
        emitted_before = len(out) - len(PROMPT)
        left = setup.max_new - emitted_before
        prefix_len = len(out)
        if setup.tree is None:
            round_, reason = _chain_round(setup, models, rng, out, ender, left)
        else:
            round_, reason = _tree_round(setup, models, rng, out, ender, left)
        leaked, at = ender.round_end()
        if leaked is not None:
            reason = leaked
        tokens = [e["token"] for e in round_["emitted"]]
        stop_at = at if leaked is not None else len(tokens) - 1
        n_acc = sum(1 for e in round_["emitted"] if e["kind"] == "accepted")
        total_after = emitted_before + len(tokens)
        withheld = (
            round_.pop("_withheld")
            if "_withheld" in round_
            else (
                all(n["status"] == "accepted" for n in round_["nodes"])
                and n_acc == len(tokens)
                and reason is None
                and total_after >= setup.max_new
            )
        )
        round_.update(
            record="round",
            index=index,
            prefix_len=prefix_len,
            emitted_before=emitted_before,
            remaining_budget=left,
            greedy=setup.greedy,
            eos=setup.eos is not None and setup.eos in tokens,
            budget_stop=total_after >= setup.max_new,  # a leaking decoder counts past its end
            bonus_withheld=withheld,
            target_cache={
                "before": cache_after,
                "peak": prefix_len + len(round_["nodes"]),
                "after": prefix_len + n_acc,
                "pending": tokens[n_acc:],
            },
            timings={"draft_s": 0.001, "verify_s": 0.001, "bookkeeping_s": 0.0},
            draft_forwards=len(round_["nodes"]),
            target_forwards=1,
            pieces=[piece(t) for t in tokens],
        )
        if setup.stop_ids or setup.stop_strings:
            round_["stop"] = (
                None
                if reason is None or reason[0] == "eos"
                else {"kind": reason[0], "index": reason[1], "position": stop_at}
            )
        if "tree" in round_:
            round_["tree"]["kept_rows"] = [prefix_len + i for i in round_["tree"]["path"]]
        cache_after = prefix_len + n_acc
        lines.append(round_)
        out += tokens
        index += 1
        if reason is not None:
            ended = "eos" if reason[0] == "eos" else "stop"
    new = out[len(PROMPT) :]
    lines.append(
        {
            "record": "end",
            "status": "completed",
            "stop_reason": ended or "budget",
            "error": None,
            "ended_at": 1764400003.5,
            "wall_s": 0.25,
            "new_tokens": new,
        }
    )
    return lines


def _header(setup: Setup) -> dict:
    params: dict[str, Any] = {"draft": "toy"}
    if setup.tree is not None:
        params.update(tree=setup.tree, children=setup.children)
    config: dict[str, Any] = {
        "vocab_size": V,
        "k": setup.k,
        "max_new_tokens": setup.max_new,
        "sampling": {"temperature": 0.0 if setup.greedy else setup.temperature, "top_k": setup.top_k, "top_p": 1.0},
        "seed": setup.seed,
        "eos_token_id": setup.eos,
        "proposer": "foreign-numpy",
        "proposer_params": params,
        "device": "cpu",
        "dtype": "float64",
        "use_cache": True,
        "fault": None,
    }
    if setup.position_limit is not None:
        config["position_limit"] = setup.position_limit
    return {
        "format": "specscope-trace",
        "version": 2,
        "record": "run",
        "run_id": f"foreign-{setup.name}",
        "started_at": 1764400000.25,
        "prompt_ids": PROMPT,
        "prompt_text": "abc",
        "config": config,
        "models": {"target_name": "bigram", "draft_name": "noisy-bigram"},
        "library_versions": {"numpy": np.__version__},
        "extra": {"author": "someone else"},
        "storage": {"top_n": setup.top_n, "full_vectors": setup.vectors == "full", "full_dtype": "float64"},
        "stops": {
            "eos_token_ids": [] if setup.eos is None else [setup.eos],
            "strings": list(setup.stop_strings),
            "ids": [list(s) for s in setup.stop_ids],
        },
    }


def _node(setup: Setup, index: int, token: int, parent: int, depth: int, p: np.ndarray, q: np.ndarray | None) -> dict:
    node: dict[str, Any] = {
        "index": index,
        "token": int(token),
        "parent": parent,
        "depth": depth,
        "status": "unvisited",
        "u": None,
        "p": dist_obj(p, setup),
        "q": None if q is None else dist_obj(q, setup),
        "p_token": float(p[token]),
        "q_token": None if q is None else float(q[token]),
        "target_argmax": int(np.argmax(p)),
    }
    if q is not None:
        node["ratio"] = float(p[token]) / float(q[token])
        node["overlap"] = float(np.minimum(p, q).sum())
    node["_p"], node["_q"] = p, q  # kept while the round is built; stripped on output
    return node


def _chain_round(setup, models, rng, out, ender, left) -> tuple[dict, Any]:
    k = setup.k if setup.bug == "budget-overshoot" else min(setup.k, left)
    if setup.adaptive:
        k = rng.randrange(0, k + 1)
    ctx = list(out)
    nodes = []
    for i in range(k):
        q = models.q(ctx[-1])
        token = int(np.argmax(q)) if setup.greedy else inverse_cdf(q, rng.random())
        nodes.append(_node(setup, i, token, i - 1, i + 1, models.p(ctx[-1]), None if setup.greedy else q))
        ctx.append(token)
    emitted: list[dict] = []
    line: dict[str, Any] = {
        "k": k,
        "nodes": nodes,
        "emitted": emitted,
        "bonus_p": None,
        "rejected_node": None,
        "residual": None,
        "residual_mass": None,
    }
    for n in nodes:
        p, q, t = n["_p"], n["_q"], n["token"]
        if setup.greedy:
            ok = t == int(np.argmax(p))
        else:
            n["u"] = rng.random()
            ok = n["u"] < min(1.0, p[t] / q[t])
        if ok:
            n["status"] = "accepted"
            emitted.append({"token": t, "kind": "accepted", "node": n["index"], "draw": None})
            reason = ender.push(t)
            if reason is not None:
                return _finish(line), reason
            continue
        n["status"] = "rejected"
        line["rejected_node"] = n["index"]
        if setup.greedy:
            token, draw = int(np.argmax(p)), None
        else:
            r, mass = residual(p, q)
            draw = rng.random()
            token = inverse_cdf(p if setup.bug == "repair-from-p" else r, draw)
            line["residual"], line["residual_mass"] = dist_obj(r, setup), mass
        emitted.append({"token": token, "kind": "repaired", "node": n["index"], "draw": draw})
        return _finish(line), ender.push(token)
    if k < left or setup.bug == "budget-overshoot":
        p = models.p(ctx[-1])
        draw = None if setup.greedy else rng.random()
        token = int(np.argmax(p)) if setup.greedy else inverse_cdf(p, draw)
        line["bonus_p"] = dist_obj(p, setup)
        emitted.append({"token": token, "kind": "bonus", "node": None, "draw": draw})
        return _finish(line), ender.push(token)
    return _finish(line), None


def _finish(line: dict) -> dict:
    for n in line["nodes"]:
        n.pop("_p", None)
        n.pop("_q", None)
    return line


def _tree_shape(setup: Setup, models: Models, rng: random.Random, out: list[int], left: int):
    """(tokens, parents, p rows, q rows) of a tree drafted after `out`, cut to `left` deep."""
    tokens: list[int] = []
    parents: list[int] = []
    ctx_of: dict[int, list[int]] = {-1: list(out)}

    def children(parent: int, n: int) -> list[int]:
        q = models.q(ctx_of[parent][-1])
        if setup.children == "topk" or setup.greedy:
            return sorted(range(V), key=lambda i: (-q[i], i))[:n]
        if setup.children == "distinct" and setup.bug != "with-replacement":
            drawn: list[int] = []
            for _ in range(n):
                rest = q.copy()
                rest[drawn] = 0.0
                drawn.append(inverse_cdf(rest / rest.sum(), rng.random()))
            return drawn
        return [inverse_cdf(q, rng.random()) for _ in range(n)]

    def add(parent: int, token: int) -> int:
        tokens.append(token)
        parents.append(parent)
        ctx_of[len(tokens) - 1] = ctx_of[parent] + [token]
        return len(tokens) - 1

    if setup.tree.startswith("dynamic:"):
        o = dynamic_opts(setup.tree)
        # expand the best frontier node (by cumulative draft probability) `topk` wide, depth by depth
        frontier = [(-1, 0.0)]
        for _depth in range(1, min(o["depth"], left) + 1):
            best = max(frontier, key=lambda f: f[1])
            q = models.q(ctx_of[best[0]][-1])
            frontier = []
            for t in children(best[0], o["topk"]):
                if len(tokens) >= o["nodes"]:
                    break
                frontier.append((add(best[0], t), best[1] + float(np.log(q[t]))))
            if not frontier:
                break
    else:
        slots = static_slots(setup.tree)
        depths = depth_of(slots)
        by_parent: dict[int, int] = {}
        for parent, depth in zip(slots, depths):
            if depth <= left:
                by_parent[parent] = by_parent.get(parent, 0) + 1
        # breadth first: the slot order of the spec; a slot's parent slot is its node
        slot_node: dict[int, int] = {-1: -1}
        made: dict[int, list[int]] = {}

        def place(s: int, parent: int) -> None:
            pn = slot_node[parent]
            if pn not in made:
                made[pn] = children(pn, by_parent[parent])
            slot_node[s] = add(pn, made[pn].pop(0))

        if setup.depth_first:

            def subtree(parent_slot: int) -> None:
                for s, (parent, depth) in enumerate(zip(slots, depths)):
                    if parent == parent_slot and depth <= left:
                        place(s, parent)
                        subtree(s)

            subtree(-1)
        else:
            for s, (parent, depth) in enumerate(zip(slots, depths)):
                if depth <= left:
                    place(s, parent)
    p_rows = [models.p(ctx_of[p][-1]) for p in parents]
    q_rows = [models.q(ctx_of[p][-1]) for p in parents]
    return tokens, parents, p_rows, q_rows, ctx_of


def _tree_round(setup, models, rng, out, ender, left) -> tuple[dict, Any]:
    cut = 10**6 if setup.bug == "budget-overshoot" else left
    tokens, parents, p_rows, q_rows, ctx_of = _tree_shape(setup, models, rng, out, cut)
    depths = depth_of(parents)
    nodes = [
        _node(setup, i, t, parents[i], depths[i], p_rows[i], None if setup.greedy else q_rows[i])
        for i, t in enumerate(tokens)
    ]
    kids = {i: [c for c in range(len(tokens)) if parents[c] == i] for i in range(-1, len(tokens))}
    emitted: list[dict] = []
    tree: dict[str, Any] = {
        "spec": setup.tree,
        "children": setup.children,
        "path": [],
        "tried": [],
        "updates": [],
        "positions": [len(out) + d - 1 for d in depths],
        "visible": [_ancestors(parents, i) for i in range(len(tokens))],
    }
    line: dict[str, Any] = {
        "k": len(tokens),
        "nodes": nodes,
        "emitted": emitted,
        "bonus_p": None,
        "rejected_node": None,
        "residual": None,
        "residual_mass": None,
        "tree": tree,
        "_withheld": False,
    }
    node = -1
    reason = None
    while True:
        if len(emitted) >= left and setup.bug != "budget-overshoot":  # the budget cuts the path: no bonus
            line["_withheld"] = True
            break
        row = models.p(ctx_of[node][-1])
        running = row
        tried: list[int] = []
        tried_tokens: list[int] = []
        accepted = None
        for c in kids[node]:
            tried.append(c)
            n, t = nodes[c], tokens[c]
            if setup.greedy:
                ok = t == int(np.argmax(row))
            else:
                q_c = _proposal(setup.children, q_rows[c], tried_tokens, t)
                n["u"] = rng.random()
                ok = q_c[t] > 0 and n["u"] < min(1.0, running[t] / q_c[t])
            if ok:
                accepted = c
                n["status"] = "accepted"
                break
            n["status"] = "rejected"
            tried_tokens.append(t)
            if not setup.greedy and np.maximum(running - q_c, 0).sum() > 0:
                running, mass = residual(running, q_c)
                exact = sorted({tokens[s] for s in kids[node]})
                tree["updates"].append(
                    {
                        "parent": node,
                        "child": c,
                        "mass": mass,
                        "p_after": dist_obj(running, setup),
                        "exact_ids": exact,
                        "exact_probs": [float(running[x]) for x in exact],
                    }
                )
        if kids[node]:
            tree["tried"].append([node, tried])
        if accepted is None:
            if setup.greedy:
                token, draw = int(np.argmax(row)), None
            else:
                draw = rng.random()
                token = inverse_cdf(row if setup.bug == "repair-from-p" else running, draw)
            if kids[node]:
                line["rejected_node"] = kids[node][-1]
                emitted.append({"token": token, "kind": "repaired", "node": kids[node][-1], "draw": draw})
                if not setup.greedy:
                    line["residual"] = dist_obj(running, setup)
                    line["residual_mass"] = tree["updates"][-1]["mass"]
                    upd = tree["updates"][-1]  # the drawn token's exact entry of the final p'
                    if token not in upd["exact_ids"]:
                        upd["exact_ids"].append(token)
                        upd["exact_probs"].append(float(running[token]))
            else:
                line["bonus_p"] = dist_obj(row, setup)
                emitted.append({"token": token, "kind": "bonus", "node": None, "draw": draw})
            reason = ender.push(token)
            break
        tree["path"].append(accepted)
        emitted.append({"token": tokens[accepted], "kind": "accepted", "node": accepted, "draw": None})
        reason = ender.push(tokens[accepted])
        if reason is not None:
            break
        node = accepted
    return _finish(line), reason


def _proposal(mode: str, q: np.ndarray, tried: list[int], token: int) -> np.ndarray:
    if mode == "sampled":
        return q
    if mode == "topk":
        point = np.zeros_like(q)
        point[token] = 1.0
        return point
    rest = q.copy()
    rest[tried] = 0.0
    return rest / rest.sum() if rest.sum() > 0 else rest


def _ancestors(parents: list[int], i: int) -> list[int]:
    seen = []
    while i >= 0:
        seen.append(i)
        i = parents[i]
    return sorted(seen)


# --------------------------------------------------------------------------- leaving fields out

# name -> (record, path); the path's last key is dropped where present (nodes/emitted: in each)
OPTIONAL: dict[str, tuple[str, str]] = {
    **{
        f"header.{k}": ("run", k)
        for k in ("started_at", "prompt_text", "models", "library_versions", "extra", "storage", "stops")
    },
    **{
        f"config.{k}": ("run", f"config.{k}")
        for k in (
            "seed",
            "eos_token_id",
            "proposer",
            "proposer_params",
            "device",
            "dtype",
            "use_cache",
            "fault",
            "position_limit",
        )
    },
    **{
        f"round.{k}": ("round", k)
        for k in (
            "prefix_len",
            "emitted_before",
            "remaining_budget",
            "k",
            "greedy",
            "bonus_p",
            "rejected_node",
            "residual",
            "residual_mass",
            "eos",
            "budget_stop",
            "bonus_withheld",
            "target_cache",
            "timings",
            "draft_forwards",
            "target_forwards",
            "stop",
            "pieces",
            "tree",
        )
    },
    **{
        f"node.{k}": ("node", k)
        for k in ("index", "depth", "u", "p_token", "q_token", "ratio", "overlap", "target_argmax")
    },
    **{f"emitted.{k}": ("emitted", k) for k in ("node", "draw")},
    **{f"tree.{k}": ("tree", k) for k in ("spec", "updates", "positions", "visible", "kept_rows")},
    "tree.p_after": ("update", "p_after"),
    "tree.mass": ("update", "mass"),
    "tree.exact": ("update", "exact_ids"),
    **{f"end.{k}": ("end", k) for k in ("stop_reason", "error", "ended_at", "wall_s", "new_tokens")},
    "end": ("end", "*"),
}


def strip(lines: list[dict], names: set[str] | frozenset[str]) -> list[dict]:
    """The lines with the named optional fields left out (a copy)."""
    lines = json.loads(json.dumps(lines))
    result = []
    for line in lines:
        record = line.get("record")
        keep = True
        for name in names:
            where, key = OPTIONAL[name]
            if where == "end" and record == "end":
                if key == "*":
                    keep = False
                else:
                    line.pop(key, None)
            elif where == "run" and record == "run":
                obj, _, last = key.rpartition(".")
                (line[obj] if obj else line).pop(last, None)
            elif record == "round":
                if where == "round":
                    line.pop(key, None)
                elif where == "node":
                    for n in line["nodes"]:
                        n.pop(key, None)
                elif where == "emitted":
                    for e in line["emitted"]:
                        e.pop(key, None)
                elif where == "tree" and line.get("tree"):
                    line["tree"].pop(key, None)
                elif where == "update" and line.get("tree"):
                    for u in line["tree"].get("updates", []):
                        if key == "p_after":
                            u["p_after"] = None
                        elif key == "exact_ids":
                            u.pop("exact_ids", None)
                            u.pop("exact_probs", None)
                        else:
                            u.pop(key, None)
        if keep:
            result.append(line)
    return result


def minimal(lines: list[dict]) -> list[dict]:
    """Only the required fields (and each node's parent, and the tree's required fields)."""
    return strip(lines, set(OPTIONAL))


def jsonl(lines: list[dict]) -> str:
    return "".join(json.dumps(line) + "\n" for line in lines)


def with_setup(setup: Setup, **changes: Any) -> Setup:
    return replace(setup, **changes)


def with_stop_from_run(setup: Setup, kind: str, at: int, length: int = 2) -> Setup:
    """The setup with a stop its clean run (no stops) completes at output position
    at + length - 1 (or earlier, where it first occurs): a token sequence (`ids`) or a string
    spanning tokens, its first character dropped (`text`)."""
    lines = generate(replace(setup, stop_ids=(), stop_strings=()))
    out = lines[-1]["new_tokens"][at : at + length]
    if kind == "ids":
        return replace(setup, stop_ids=(tuple(out),))
    return replace(setup, stop_strings=("".join(piece(t) for t in out)[1:],))

"""Test helpers: synthetic rounds (no models needed) and round comparison."""

from __future__ import annotations

import uuid
from typing import Any

import numpy as np

from specscope.core.records import CacheState, DraftNode, EmittedToken, Round, RoundTimings, RunConfig
from specscope.core.sampling.reference import SamplingConfig


def dist(rng: np.random.Generator, vocab: int) -> np.ndarray:
    x = rng.random(vocab) ** 4
    return x / x.sum()


def synthetic_config(
    vocab: int = 64, run_id: str | None = None, greedy: bool = False, max_new_tokens: int = 10_000
) -> RunConfig:
    return RunConfig(
        run_id=run_id or uuid.uuid4().hex,
        prompt_ids=(1, 2, 3),
        max_new_tokens=max_new_tokens,
        k=4,
        sampling=SamplingConfig(temperature=0.0 if greedy else 0.8, top_k=0, top_p=1.0),
        seed=7,
        eos_token_id=None,
        proposer="draft",
        proposer_params={"draft": "synthetic"},
        target_name="synthetic-target",
        draft_name="synthetic-draft",
        vocab_size=vocab,
    )


def synthetic_round(config: RunConfig, index: int, emitted_before: int, rng: np.random.Generator, k: int = 4) -> Round:
    """A plausible stochastic round: some accepted nodes, then a rejection or a bonus."""
    vocab = config.vocab_size
    n_acc = int(rng.integers(0, k + 1))
    nodes = []
    for i in range(k):
        p, q = dist(rng, vocab), dist(rng, vocab)
        token = int(rng.integers(vocab))
        status = "accepted" if i < n_acc else ("rejected" if i == n_acc else "unvisited")
        nodes.append(
            DraftNode(
                index=i,
                token=token,
                parent=i - 1,
                depth=i + 1,
                p=p,
                q=q,
                status=status,
                u=float(rng.random()) if status != "unvisited" else None,
                p_token=float(p[token]),
                q_token=float(q[token]),
                ratio=float(p[token] / q[token]),
                overlap=float(np.minimum(p, q).sum()),
                target_argmax=int(np.argmax(p)),
            )
        )
    emitted = [EmittedToken(nodes[i].token, "accepted", i) for i in range(n_acc)]
    residual = residual_mass = bonus_p = None
    rejected = None
    if n_acc < k:
        rejected = n_acc
        pos = np.maximum(nodes[n_acc].p - nodes[n_acc].q, 0)
        residual_mass = float(pos.sum())
        residual = pos / residual_mass
        emitted.append(EmittedToken(int(np.argmax(residual)), "repaired", n_acc, float(rng.random())))
    else:
        bonus_p = dist(rng, vocab)
        emitted.append(EmittedToken(int(np.argmax(bonus_p)), "bonus", None, float(rng.random())))
    prefix = len(config.prompt_ids) + emitted_before
    return Round(
        run_id=config.run_id,
        index=index,
        prefix_len=prefix,
        emitted_before=emitted_before,
        remaining_budget=config.max_new_tokens - emitted_before,
        k=k,
        greedy=False,
        nodes=tuple(nodes),
        bonus_p=bonus_p,
        rejected_node=rejected,
        residual=residual,
        residual_mass=residual_mass,
        emitted=tuple(emitted),
        eos=False,
        budget_stop=False,
        bonus_withheld=False,
        target_cache=CacheState(prefix - 1, prefix + k, prefix + n_acc, (emitted[-1].token,)),
        draft_cache=CacheState(prefix - 2, prefix + k - 1, prefix + n_acc, (emitted[-1].token,)),
        timings=RoundTimings(float(rng.random()) * 1e-3, float(rng.random()) * 1e-3, 1e-5),
        draft_forwards=k,
        target_forwards=1,
    )


def synthetic_rounds(config: RunConfig, n: int, seed: int = 0) -> list[Round]:
    rng = np.random.default_rng(seed)
    out, emitted = [], 0
    for i in range(n):
        r = synthetic_round(config, i, emitted, rng)
        out.append(r)
        emitted += len(r.emitted)
    return out


def _same_vec(a: np.ndarray | None, b: np.ndarray | None, atol: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if atol == 0:
        return np.array_equal(np.asarray(a), np.asarray(b))
    return np.asarray(a).shape == np.asarray(b).shape and np.allclose(np.asarray(a), np.asarray(b), rtol=0, atol=atol)


def assert_rounds_equal(a: Round, b: Round, atol: float = 0.0, vectors: bool = True) -> None:
    """Everything of two rounds equal; distributions to atol (0 = bit-exact)."""
    for name in (
        "run_id",
        "index",
        "prefix_len",
        "emitted_before",
        "remaining_budget",
        "k",
        "greedy",
        "rejected_node",
        "residual_mass",
        "emitted",
        "eos",
        "budget_stop",
        "bonus_withheld",
        "target_cache",
        "draft_cache",
        "timings",
        "draft_forwards",
        "target_forwards",
    ):
        assert getattr(a, name) == getattr(b, name), (
            f"round {a.index}: {name} differs: {getattr(a, name)!r} != {getattr(b, name)!r}"
        )
    assert len(a.nodes) == len(b.nodes)
    for x, y in zip(a.nodes, b.nodes):
        for name in (
            "index",
            "token",
            "parent",
            "depth",
            "status",
            "u",
            "p_token",
            "q_token",
            "ratio",
            "overlap",
            "target_argmax",
            "confidence",
        ):
            assert getattr(x, name) == getattr(y, name), f"round {a.index} node {x.index}: {name} differs"
        if vectors:
            assert _same_vec(x.p, y.p, atol), f"round {a.index} node {x.index}: p differs"
            assert _same_vec(x.q, y.q, atol), f"round {a.index} node {x.index}: q differs"
    if vectors:
        assert _same_vec(a.bonus_p, b.bonus_p, atol), f"round {a.index}: bonus_p differs"
        assert _same_vec(a.residual, b.residual, atol), f"round {a.index}: residual differs"


def downgrade_sqlite_store(path: Any, version: int) -> None:
    """Turn a store written by this specscope into one of an older schema `version` (1 to 6),
    as that specscope wrote it: version 6 has no draft_nodes.confidence; version 5 has no
    stop columns either (runs.stops, rounds.stop);
    version 4 has no runs.position_limit either; version 3 has no tree columns on rounds
    either; version 2 keeps
    each run's whole token list in runs.new_tokens and has no run_tokens table either;
    version 1 has no runs.unrecorded either."""
    import json
    import sqlite3

    con = sqlite3.connect(path)
    con.execute("ALTER TABLE draft_nodes DROP COLUMN confidence")
    if version < 6:
        con.execute("ALTER TABLE runs DROP COLUMN stops")
        con.execute("ALTER TABLE rounds DROP COLUMN stop")
    if version < 5:
        con.execute("ALTER TABLE runs DROP COLUMN position_limit")
    for column in ("tree", "tree_top", "tree_full") if version < 4 else ():
        con.execute(f"ALTER TABLE rounds DROP COLUMN {column}")
    if version >= 3:
        con.execute("DELETE FROM schema_version")
        con.execute("INSERT INTO schema_version VALUES (?, 'older schema', 0)", (version,))
        con.commit()
        con.close()
        return
    tokens: dict[str, list[int]] = {}
    for run_id, blob in con.execute("SELECT run_id, tokens FROM run_tokens ORDER BY run_id, start"):
        tokens.setdefault(run_id, []).extend(np.frombuffer(blob, dtype="<i4").tolist())
    for (run_id,) in con.execute("SELECT run_id FROM runs").fetchall():
        con.execute("UPDATE runs SET new_tokens = ? WHERE run_id = ?", (json.dumps(tokens.get(run_id, [])), run_id))
    con.execute("DROP TABLE run_tokens")
    con.execute("ALTER TABLE runs DROP COLUMN n_new_tokens")
    if version < 2:
        con.execute("ALTER TABLE runs DROP COLUMN unrecorded")
    con.execute("DELETE FROM schema_version")
    con.execute("INSERT INTO schema_version VALUES (?, 'older schema', 0)", (version,))
    con.commit()
    con.close()

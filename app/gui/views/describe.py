"""Human-readable descriptions of tokens, nodes and decisions (pure; used by tooltips,
the inspector header and the draft tree)."""

from __future__ import annotations

from html import escape

from specscope.app.gui import theme
from specscope.app.gui.model.runmodel import Cell, RunModel, TokenText, visible_text
from specscope.core.records import DraftNode, Round


def fmt(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "—"
    return f"{x:.{digits}g}"


def tok(token: int, token_text: TokenText) -> str:
    return f"“{escape(visible_text(token_text(token)))}” (id {token})"


def after_accepted_eos(r: Round, n: DraftNode) -> bool:
    """Whether `n` went unvisited because an earlier draft token, an EOS, was accepted."""
    last = r.emitted[-1] if r.emitted else None
    return bool(
        r.eos and last is not None and last.kind == "accepted" and last.node is not None and last.node < n.index
    )


def is_coupled(config) -> bool:
    """Whether a run was coupled (core.verify.coupling; read from its proposer_params without importing
    it, a view needs no torch): its decisions are Gumbel picks, not draws."""
    if config is None:
        return False
    params = config.proposer_params or {}
    return params.get("verifier") == "coupled" and not config.sampling.greedy


COUPLED_REPAIR = (
    "coupled repair: the target's pick y_j = argmax log p + G_j at this output position, not a draw from the residual"
)


def node_decision(
    n: DraftNode, greedy: bool, token_text: TokenText | None = None, after_eos: bool = False, coupled: bool = False
) -> str:
    if n.status == "unvisited":
        # a tree's untried node may follow an accepted sibling as well as a rejection
        return (
            "not visited: discarded after an accepted EOS"
            if after_eos
            else "never reached: not tested (the round's walk ended before this node)"
        )
    if greedy:
        verdict = "accepted" if n.status == "accepted" else "rejected"
        argmax = tok(n.target_argmax, token_text) if token_text is not None else str(n.target_argmax)
        return (
            f"greedy: the draft's argmax {'=' if n.status == 'accepted' else '≠'} the target's argmax "
            f"{argmax} → {verdict}"
        )
    if coupled:
        rel = "=" if n.status == "accepted" else "≠"
        return f"coupled: the draft's token {rel} the target's pick y_j (argmax log p + G_j) → {n.status}"
    accept_p = min(1.0, n.ratio) if n.ratio is not None else None
    if n.u is None:  # transformers' generate() draws u inside its loop and keeps none
        return f"u was not recorded (this engine keeps no draws); min(1, p/q) = {fmt(accept_p)} → {n.status}"
    rel = "<" if n.status == "accepted" else "≥"
    return f"u = {fmt(n.u)} {rel} min(1, p/q) = {fmt(accept_p)} → {n.status}"


def describe_node(r: Round, n: DraftNode, token_text: TokenText) -> str:
    lines = [
        f"<b>round {r.index}</b> · draft position {n.index + 1} (depth {n.depth})",
        f"draft token {tok(n.token, token_text)}",
        f"p(x) = {fmt(n.p_token)} · q(x) = {fmt(n.q_token)} · ratio p/q = {fmt(n.ratio)}",
    ]
    if n.overlap is not None:
        lines.append(f"Σ min(p, q) = {fmt(n.overlap)} (acceptance probability here)")
    lines.append(f"target argmax = {n.target_argmax}")
    lines.append(node_decision(n, r.greedy, token_text, after_accepted_eos(r, n)))
    return "<br>".join(lines)


def describe_cell(r: Round | None, c: Cell, token_text: TokenText, coupled: bool = False) -> str:
    if c.kind == theme.PROMPT or r is None:
        return f"prompt token {tok(c.token, token_text)}"
    head = f"<b>round {r.index}</b> · {theme.KIND_NAMES[c.kind]}"
    if c.out_pos >= 0:
        head += f" · output position {c.out_pos}"
    lines = [head, f"token {tok(c.token, token_text)}"]
    if c.kind in (theme.ACCEPTED, theme.REJECTED, theme.UNVISITED) and 0 <= c.pos < len(r.nodes):
        n = r.nodes[c.pos]
        lines.append(f"p(x) = {fmt(n.p_token)} · q(x) = {fmt(n.q_token)} · ratio = {fmt(n.ratio)} · u = {fmt(n.u)}")
        lines.append(node_decision(n, r.greedy, token_text, after_accepted_eos(r, n), coupled))
    elif c.kind == theme.REPAIRED and 0 <= c.pos < len(r.nodes):
        n = r.nodes[c.pos]
        lines.append(f"replaces rejected draft {tok(n.token, token_text)}")
        lines.append(
            f"rejected: p(x) = {fmt(n.p_token)} · q(x) = {fmt(n.q_token)} · ratio = {fmt(n.ratio)} · u = {fmt(n.u)}"
        )
        if r.greedy:
            lines.append("greedy repair: the target argmax")
        elif coupled:
            lines.append(COUPLED_REPAIR)
        else:
            p = n.p
            resid = r.residual
            lines.append(f"residual mass r = Σ max(p − q, 0) = {fmt(r.residual_mass)}")
            if resid is not None and c.token < len(resid):
                lines.append(
                    f"residual(x) = {fmt(float(resid[c.token]))} · p(x) = "
                    f"{fmt(float(p[c.token]) if p is not None else None)}"
                )
            rep = r.repair
            if rep is not None and rep.draw is not None:
                lines.append(f"drawn from the residual with u = {fmt(rep.draw)}")
    elif c.kind == theme.BONUS:
        lines.append(
            f"all {len(r.nodes)} draft tokens accepted: bonus from the target's next p"
            + (" (coupled: its pick y_j)" if coupled else "")
        )
        p = r.bonus_p
        if p is not None and c.token < len(p):
            lines.append(f"p(x) = {fmt(float(p[c.token]))}")
        b = r.bonus
        if b is not None and b.draw is not None:
            lines.append(f"drawn with u = {fmt(b.draw)}")
    if c.eos:
        lines.append(f"<span style='color:{theme.EOS_COLOR.name()}'><b>EOS</b>: the run ends here</span>")
    if any(n.parent != n.index - 1 for n in r.nodes):
        path = tree_path(r)
        lines.append(
            f"token tree: accepted path of {len(path)} of {len(r.nodes)} nodes, {len(r.nodes) - len(path)} discarded"
        )
    return "<br>".join(lines)


def describe_round(r: Round) -> str:
    parts = [
        f"round {r.index}",
        f"prefix {r.prefix_len}",
        f"k = {r.k}",
        f"accepted {r.accepted}/{r.drafted}",
        f"accepted length {r.accepted_length}",
    ]
    if r.eos:
        parts.append("EOS")
    if r.budget_stop:
        parts.append("budget reached")
    if r.bonus_withheld:
        parts.append("bonus withheld (no budget)")
    return " · ".join(parts)


# ---------------------------------------------------------------------- token trees


def is_tree_run(model: RunModel) -> bool:
    """Whether a run drafts token trees: its proposer names a tree, or a round was one."""
    params = model.config.proposer_params if model.config is not None else None
    return bool((params or {}).get("tree")) or model.metrics.tree_rounds > 0


def badge_text(count: int) -> str:
    """The timeline's cell for a tree round's discarded nodes."""
    return f"✗{count}"


def tree_path(r: Round) -> list[int]:
    """The accepted path of a tree round, from the prefix down (the accepted nodes)."""
    return [e.node for e in r.emitted if e.kind == "accepted" and e.node is not None]


def describe_tree_round(r: Round, token_text: TokenText) -> str:
    """A tree round's accepted path and its discarded nodes (rejected, and never tried)."""
    path = tree_path(r)
    rejected = sum(1 for n in r.nodes if n.status == "rejected")
    unvisited = sum(1 for n in r.nodes if n.status == "unvisited")
    depth = max((n.depth for n in r.nodes), default=0)
    steps = " → ".join(tok(r.nodes[i].token, token_text) for i in path) or "none (no draft accepted)"
    end = r.repair or r.bonus
    tail = f", then the {end.kind} {tok(end.token, token_text)}" if end is not None else ""
    return "<br>".join(
        [
            f"<b>round {r.index}</b> · token tree of {len(r.nodes)} nodes, depth {depth}",
            f"accepted path ({len(path)} nodes): {steps}{tail}",
            f"<b>{len(r.nodes) - len(path)} discarded</b>: {rejected} rejected, {unvisited} never tried "
            "(pruned with a rejected sibling's subtree, or past the accepted node)",
            "click: the first rejected node",
        ]
    )

"""Why did speculative greedy output differ from plain greedy decoding: numerics or a logic bug?

Greedy speculative decoding must emit exactly what plain greedy decoding of the target emits.
In exact arithmetic it does; in floating point the verify forward (one target forward over
the pending context and the whole draft) and plain decoding's one-token forward compute the
same logits with different kernels and reduction orders, so where two tokens' logits are
within rounding of each other the two can pick different tokens (transformers #39421; with
bfloat16 weights such near ties are common). Anything else is a bug.

`diverge_report` decodes the reference plainly with the same target (core.decode.baseline:
one-token forwards over a KV cache), finds the first output position where the speculative
output and the reference differ, and classifies it:

- the round that emitted the differing token is found, and its verify forward is run again
  honestly: the same shape (the round's pending tokens and its draft, as a chain or under
  the tree mask) on a cache of the correct prefix, so that a spoiled cache in the run cannot
  pass for numerics. Its logits row at the position is `verify`; the reference's
  one-token row there is `one_token`;
- `margin` = one_token[plain token] - one_token[speculative token] (the top-2 margin when
  the speculative token is the runner-up, as in every near tie), and `logit_diff` =
  max over the vocabulary of |verify - one_token|. Each of the two logits can move by up
  to logit_diff between the forwards, so their order can flip only if margin <= 2 *
  logit_diff;
- a **near tie** when it can, and the checker (core.check.checker: check_report, and
  recompute_findings where the target's dtype makes a recompute exact enough) finds no
  wrong-output rule broken in a round up to the divergence; a **logic bug** otherwise,
  pointing at the first round the checker flags (else the divergence round).

An output that is a prefix of the other (one stops early, or goes on past EOS or the budget)
is a logic bug: numerics change which token comes, not how many. Greedy only: at T > 0 the
outputs are samples, and differing from plain greedy means nothing (ValueError).
torch is imported inside the functions: `specscope check` imports this package without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from specscope.core.check.checker import Finding, check_report, recompute_findings
from specscope.core.check.rules import WASTED_WORK, WRONG_OUTPUT
from specscope.core.records import Round, RunConfig, RunEnd

NEAR_TIE = "near tie"
LOGIC_BUG = "logic bug"
IDENTICAL = "identical"

# dtypes whose recompute matches a cached run within recompute_findings' tolerance (1e-4 on
# p); in half precision a correct run's cached and full forwards differ by more
EXACT_RECOMPUTE_DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class Divergence:
    """The first difference between a greedy speculative run and plain greedy decoding."""

    run_id: str
    verdict: str  # IDENTICAL | NEAR_TIE | LOGIC_BUG
    reason: str  # one sentence saying why
    speculative: tuple[int, ...]
    plain: tuple[int, ...]
    dtype: str = ""
    position: int | None = None  # output position of the first difference
    speculative_token: int | None = None  # None: the speculative output had ended
    plain_token: int | None = None  # None: plain decoding had ended
    round: int | None = None  # the round that emitted (or would have emitted) the position
    node: int | None = None  # the draft node whose verify row predicted it (None: the round's prefix row)
    margin: float | None = None  # one-token logits: plain token minus speculative token
    top2_margin: float | None = None  # one-token logits: best minus second best
    logit_diff: float | None = None  # max |verify logits - one-token logits| over the vocabulary
    verify_margin: float | None = None  # verify logits: plain token minus speculative token
    findings: tuple[Finding, ...] = ()  # the checker's wrong-output findings in rounds up to the divergence
    blame_round: int | None = None  # the first flagged round, else the divergence round
    not_checked: dict[str, str] = field(default_factory=dict)

    @property
    def identical(self) -> bool:
        return self.verdict == IDENTICAL

    def lines(self, token_text: Callable[[int], str] = lambda t: f"id {t}") -> list[str]:
        """The comparison in words, one line each (the CLI prints them, the window shows them)."""
        if self.identical:
            return [f"identical to plain greedy decoding ({len(self.plain)} tokens, {self.dtype})"]

        def shown(token: int | None) -> str:
            return "(none: the output had ended)" if token is None else token_text(token)

        row = "" if self.margin is None else ", prefix row" if self.node is None else f", node {self.node}"
        out = [
            f"first difference at output position {self.position} (round {self.round}{row}, {self.dtype}): "
            f"{self.verdict.upper()}",
            f"  speculative: {shown(self.speculative_token)}   plain: {shown(self.plain_token)}",
        ]
        if self.margin is not None:
            out += [
                f"  one-token forward: plain minus speculative token {self.margin:.4g} "
                f"(top-2 margin {self.top2_margin:.4g})",
                f"  verify forward vs one-token forward: logits differ by up to {self.logit_diff:.4g} "
                f"(can flip a margin up to {2 * (self.logit_diff or 0.0):.4g}); verify margin {self.verify_margin:.4g}",
            ]
        out.append(f"  {self.reason}")
        if self.findings:
            out.append(
                f"  checker: {len(self.findings)} finding(s) up to round {self.round}, first at round "
                f"{self.blame_round}:"
            )
            out += [f"    {f}" for f in self.findings[:3]]
        else:
            out.append(f"  checker: no findings in rounds 0-{self.round}")
        out += [f"  not checked: {rule} ({why})" for rule, why in self.not_checked.items()]
        return out

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["speculative"], out["plain"] = list(self.speculative), list(self.plain)
        out["findings"] = [f.to_dict() for f in self.findings]
        return out


def require_greedy(config: RunConfig) -> None:
    """ValueError for a sampled run: only greedy output has one right answer to differ from."""
    if not config.sampling.greedy:
        raise ValueError(
            f"run {config.run_id} was sampled at temperature {config.sampling.temperature:g}: "
            "divergence from plain greedy decoding is only defined at temperature 0"
        )


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where a and b differ (or where the shorter ends); None when equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def plain_reference(
    target: Any, config: RunConfig, speculative: Sequence[int], token_piece: Callable[[int], str] | None = None
) -> tuple[list[int], Any]:
    """Plain greedy decoding of `target` on the run's prompt, budget, EOS ids and stops (stop
    strings need `token_piece`, the tokenizer's text: core.decode.stops.token_piece_function):
    (tokens, the one-token logits row at the first position where it differs from
    `speculative`, or None)."""
    from specscope.core.decode.baseline import plain_generate
    from specscope.core.decode.stops import Stops
    from specscope.core.sampling.row_ops import row_argmax

    kept: list[Any] = []

    def watch(position: int, row: Any) -> None:
        # called before plain decoding picks this row's token: the same argmax it will pick
        if not kept and (position >= len(speculative) or int(row_argmax(row)) != speculative[position]):
            kept.append(row.clone())

    if config.stop_strings and token_piece is None:
        raise ValueError(
            f"run {config.run_id} stops at strings {list(config.stop_strings)}: plain decoding needs "
            "the tokenizer to match them"
        )
    result = plain_generate(
        target,
        list(config.prompt_ids),
        config.max_new_tokens,
        sampling=config.sampling,
        eos_token_id=tuple(sorted(config.eos_ids)),
        on_logits=watch,
        stops=Stops(tuple(config.stop_strings), tuple(tuple(s) for s in config.stop_ids)),
        token_piece=token_piece,
    )
    return list(result.new_tokens), (kept[0] if kept else None)


def emitting_round(rounds: Sequence[Round], position: int) -> Round:
    """The round whose emitted tokens hold output `position` (the last round past the end)."""
    for rnd in rounds:
        if rnd.emitted_before <= position < rnd.emitted_before + len(rnd.emitted):
            return rnd
    return rounds[-1]


def predicting_node(rnd: Round, offset: int) -> int | None:
    """The draft node after which the verify forward predicted the round's `offset`-th
    emitted token (None: the round's prefix row). Every emitted token but the last is an
    accepted node, so the row is the one after the previous emitted token's node."""
    if offset == 0:
        return None
    node = rnd.emitted[offset - 1].node
    return offset - 1 if node is None else node  # a trace that leaves out `node`: a chain's accepted node i is i


def verify_row(target: Any, rnd: Round, context: Sequence[int], node: int | None) -> Any:
    """The logits row the round's verify forward gives after `node` (None: at the prefix),
    recomputed honestly: the cache holds the correct prefix minus the round's pending
    tokens, then one forward over the pending tokens and the whole draft, as a chain or
    under the tree mask (core.decode.layout), exactly as a correct decoder runs it."""
    from specscope.core.decode.kv import CachedLM
    from specscope.core.decode.layout import ChainLayout, TreeLayout
    from specscope.core.draft.proposers import Draft

    prefix_len = rnd.prefix_len
    before = rnd.target_cache.before if rnd.target_cache is not None else prefix_len - 1
    pending = min(max(prefix_len - before, 1), prefix_len)
    lm = CachedLM(target)
    if prefix_len - pending > 0:
        lm.feed(list(context[: prefix_len - pending]), keep=1)
    draft = Draft(tokens=tuple(n.token for n in rnd.nodes), parents=tuple(n.parent for n in rnd.nodes), q=None)
    layout = ChainLayout() if draft.is_chain else TreeLayout()  # as the decoder laid it out
    logits, _ = layout.forward(lm, list(context[prefix_len - pending : prefix_len]), draft, prefix_len)
    return logits[0 if node is None else node + 1]


def numbers_at(verify: Any, one_token: Any, plain_token: int, spec_token: int) -> dict[str, float]:
    """margin, top2_margin, logit_diff and verify_margin (module docstring) of two rows."""
    import torch

    one = one_token.double()
    ver = verify.double()
    top2 = torch.topk(one, 2).values
    return {
        "margin": float(one[plain_token] - one[spec_token]),
        "top2_margin": float(top2[0] - top2[1]),
        "logit_diff": float((ver - one).abs().max()),
        "verify_margin": float(ver[plain_token] - ver[spec_token]),
    }


def wrong_output(finding: Finding) -> bool:
    """A finding that can change the output (a severity of "wasted work" cannot)."""
    return getattr(finding, "severity", WRONG_OUTPUT) != WASTED_WORK


def checker_findings(
    config: RunConfig, rounds: Sequence[Round], target: Any, upto: int, end: RunEnd | None = None
) -> tuple[list[Finding], dict[str, str]]:
    """The checker's wrong-output findings in rounds <= `upto`, and what it could not check."""
    report = check_report(config, rounds, end=end)
    found = [f for f in report.findings if f.round <= upto and wrong_output(f)]
    not_checked = dict(report.not_checked)
    if config.dtype in EXACT_RECOMPUTE_DTYPES:
        found += recompute_findings(config, [r for r in rounds if r.index <= upto], target)
    else:
        not_checked["recompute"] = (
            f"a {config.dtype} target's cached and full forwards differ by rounding beyond the recompute tolerance"
        )
    return sorted(found, key=lambda f: f.round), not_checked


def diverge_report(
    config: RunConfig,
    rounds: Iterable[Round],
    target: Any,
    end: RunEnd | None = None,
    token_piece: Callable[[int], str] | None = None,
) -> Divergence:
    """Compare a greedy speculative run (its config and every round) with plain greedy
    decoding of `target`, and classify the first difference (module docstring). A run with
    stop strings needs `token_piece` (its tokenizer's text) for the reference to stop there too."""
    require_greedy(config)
    rounds = list(rounds)
    speculative = [t.token for rnd in rounds for t in rnd.emitted]
    plain, one_token = plain_reference(target, config, speculative, token_piece)
    common = Divergence(
        run_id=config.run_id,
        verdict=IDENTICAL,
        reason="",
        speculative=tuple(speculative),
        plain=tuple(plain),
        dtype=config.dtype,
    )
    at = first_difference(speculative, plain)
    if at is None:
        return replace(common, reason=f"the outputs are identical ({len(plain)} tokens)")
    if not rounds:
        return replace(
            common,
            verdict=LOGIC_BUG,
            position=at,
            plain_token=plain[at],
            reason="the run has no rounds, but plain decoding emits tokens",
        )
    rnd = emitting_round(rounds, at)
    findings, not_checked = checker_findings(config, rounds, target, rnd.index, end)
    blame = findings[0].round if findings else rnd.index
    where = replace(
        common,
        verdict=LOGIC_BUG,
        position=at,
        round=rnd.index,
        findings=tuple(findings),
        blame_round=blame,
        not_checked=not_checked,
        speculative_token=speculative[at] if at < len(speculative) else None,
        plain_token=plain[at] if at < len(plain) else None,
    )
    if where.speculative_token is None or where.plain_token is None:
        return replace(where, reason=_length_reason(config, where.plain_token, plain))
    context = list(config.prompt_ids) + speculative
    node = predicting_node(rnd, at - rnd.emitted_before)
    numbers = numbers_at(verify_row(target, rnd, context, node), one_token, where.plain_token, where.speculative_token)
    near = numbers["margin"] <= 2 * numbers["logit_diff"] and not findings
    reason = _tie_reason(numbers, findings, near)
    return replace(
        where,
        verdict=NEAR_TIE if near else LOGIC_BUG,
        reason=reason,
        node=node,
        margin=numbers["margin"],
        top2_margin=numbers["top2_margin"],
        logit_diff=numbers["logit_diff"],
        verify_margin=numbers["verify_margin"],
    )


def _length_reason(config: RunConfig, plain_token: int | None, plain: Sequence[int]) -> str:
    if plain_token is None:
        why = (
            f"reached the budget of {config.max_new_tokens} tokens"
            if len(plain) >= config.max_new_tokens
            else "stopped at EOS"
            if plain and plain[-1] in config.eos_ids
            else "stopped at a stop"
        )
        return f"plain decoding {why} here, but the speculative output goes on"
    return "the speculative output ends here, but plain decoding goes on"


def _tie_reason(numbers: dict[str, float], findings: Sequence[Finding], near: bool) -> str:
    m, d = numbers["margin"], numbers["logit_diff"]
    if near:
        return (
            f"the two tokens' logits are {m:.3g} apart, within what the measured difference of {d:.3g} between "
            "the verify forward and the one-token forward can flip (2 x difference): numerics, not a bug"
        )
    if findings:
        return f"the checker flags round {findings[0].round} ({findings[0].rule}): a logic bug"
    return (
        f"the two tokens' logits are {m:.3g} apart, more than the measured difference of {d:.3g} between the "
        "verify forward and the one-token forward can flip: a logic bug"
    )


def diverge_run(
    decoder: Any, target: Any, prompt_ids: Sequence[int], max_new_tokens: int, config: RunConfig | None = None
) -> Divergence:
    """Run `decoder` (a SpeculativeDecoder, FaultyDecoder or TransformersEngine) greedily on
    the prompt, then `diverge_report` its rounds against plain decoding of `target`."""
    config = config or decoder.run_config(prompt_ids, max_new_tokens)
    require_greedy(config)
    rounds: list[Round] = []
    result = decoder.start(prompt_ids, max_new_tokens, config=config).drain(rounds.append)
    end = RunEnd(status="completed", stop_reason=result.stop_reason, new_tokens=len(result.new_tokens))
    return diverge_report(config, rounds, target, end=end, token_piece=getattr(decoder, "token_piece", None))

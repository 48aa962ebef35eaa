"""The train/serve gap of an EAGLE-3 head on a chat prompt (issue 41): what the head is fed when
specscope SERVES it (the decoder and the proposer: the chat template's ids, which layers'
features at which positions, the token paired with each feature, its rotary positions, the
entries kept after a rejection, the draft steps' fed-back outputs and tokens) against what
training/train_head.py TRAINS it on for the same text (cache_answers over prompt + answer, the
unroll's inputs and the label positions).

Served, a round after a context of c tokens (the last the bonus or repair) drafts its first
token, the one at index c, from the head's entry (f_{c-2}, x_{c-1}) at row c - 2; its draft at
depth s reads its own previous output and its previous draft token at row c - 2 + s. In the
unroll's terms: anchor j = c - 2, depth s at rotary position j + s, label = the target's
distribution at position j + s + 1. Training must use
those same pairs, positions and labels, and only where serving drafts: the answer, never the
prompt (the template and a fixed system turn, which the head memorises: counting them made
the SmolLM2 head's held-out chat accuracy .32 where its answers alone give about .13).

Runs on a random-initialised chat Llama everywhere, and on the real SmolLM2 with its shipped
head where SmolLM2 is fetched (never fetched here)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import torch

from tests.training.scripts import load_script

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
LAYERS = (1, 2, 3)
PROMPT = "Explain in two sentences why the sky is blue."


@pytest.fixture(scope="module")
def train_head():
    return load_script("train_head", "specscope_train_head_gap")


@dataclass
class Served:
    """What the head saw while serving: one row per head step, and one per proposal."""

    steps: list[dict] = field(default_factory=list)  # row, positions, features, tokens, real, output
    proposals: list[tuple[int, tuple[int, ...]]] = field(default_factory=list)  # (context length, draft tokens)


def serve(target, tok, head_dir: Path, new_tokens: int, k: int = 2) -> tuple[list[int], list[int], Served]:
    """Greedy speculative decoding of the chat prompt through specscope's registry, decoder and
    proposer, recording every head step's inputs and positions."""
    from specscope.core import SamplingConfig, SpeculativeDecoder
    from specscope.core.draft.registry import build_proposer
    from specscope.core.loading.chat import chat_prompt_ids, turn_end_id

    prompt = chat_prompt_ids(tok, PROMPT)
    proposer = build_proposer(f"eagle3:{head_dir}")
    head, seen = proposer.head, Served()
    step, positions, propose = head.step, head.positions, proposer.propose

    def record_positions(start, n, like, at=None):
        seen.steps[-1]["positions"] = list(range(start, start + n)) if at is None else at.positions.tolist()
        return positions(start, n, like, at)

    def record_step(features, tokens, from_target, at=None):
        seen.steps.append({"row": head.length, "features": features[0].float().clone(), "tokens": tokens[0].tolist()})
        seen.steps[-1]["real"] = from_target
        out = step(features, tokens, from_target, at)
        seen.steps[-1]["output"] = out[0].float().clone()
        return out

    def record_propose(context, k, sampling, rng):
        draft = propose(context, k, sampling, rng)
        seen.proposals.append((len(context), tuple(draft.tokens)))
        return draft

    head.step, head.positions, proposer.propose = record_step, record_positions, record_propose
    decoder = SpeculativeDecoder(
        target, proposer, k=k, sampling=SamplingConfig(temperature=0), eos_token_id=turn_end_id(target, tok)
    )
    answer = list(decoder.generate(prompt, new_tokens).new_tokens)
    return prompt, answer, seen


def check_gap(train_head, target, tok, head_dir: Path, layers: tuple[int, ...], new_tokens: int) -> dict:
    """Serve, build the training cache of the same text, and assert they agree; the measures."""
    from specscope.core.draft.registry import build_proposer
    from specscope.core.loading.chat import turn_end_id

    prompt, answer, seen = serve(target, tok, head_dir, new_tokens)
    full = prompt + answer
    eos = turn_end_id(target, tok)
    cached = train_head.cache_answers(target, layers, [(prompt, answer)], eos, 256, 16, 1)
    assert len(full) <= 256
    # The same token ids: the chat template applied alike, the answer as generated.
    assert cached.tokens[0, : len(full)].tolist() == full
    assert int(cached.first[0]) == len(prompt) - 1

    real_end = 0  # head cache rows built from the target's features (kept across rounds)
    for s in seen.steps:
        row, n = s["row"], len(s["tokens"])
        assert s["positions"] == list(range(row, row + n)), "the head's rotary positions are its cache rows"
        if s["real"]:
            # After a rejection the head's cache keeps exactly the entries of the committed path.
            assert row == real_end, f"real entries resume at row {row}, the committed path ends at {real_end}"
            # Entry j pairs the target's feature at position j (its layers, low to high) with x_{j+1}.
            assert s["tokens"] == full[row + 1 : row + 1 + n]
            trained = cached.features[0, row : row + n].flatten(1).float()
            err = (s["features"] - trained).abs().max() / trained.abs().max()
            assert float(err) < 2e-2, f"the served features of rows {row}..{row + n - 1} differ from the trained ones"
            real_end = row + n

    # Each draft step feeds the head's own output and the token it just drafted, at the next row:
    # the unroll's depth s for anchor j = context - 2 at rotary position j + s.
    drafts = iter(s for s in seen.steps if not s["real"])
    for context, tokens in seen.proposals:
        if not tokens:
            continue
        for depth in range(1, len(tokens)):
            s = next(drafts)
            assert s["row"] == context - 2 + depth
            assert s["tokens"] == [tokens[depth - 1]]

    # Labels: exactly the positions whose next token a served head drafts (the answer's), none of the prompt's.
    drafted = {context - 1 + d for context, tokens in seen.proposals for d in range(len(tokens))}
    drafted = {p for p in drafted if p < len(full) - 1}
    labels = set(cached.valid[0].nonzero().flatten().tolist())
    assert min(labels) >= len(prompt), f"training labels start at position {min(labels)}, inside the prompt"
    assert drafted <= labels | {len(full) - 1}

    # The training unroll on the cached features predicts what the served head drafted first.
    proposer = build_proposer(f"eagle3:{head_dir}")
    proposer.target_features(target)
    head = proposer.head.float().eval()
    with torch.no_grad():
        features = cached.features.flatten(2).float()
        outs = train_head.unroll(head, target.get_input_embeddings(), features, cached.tokens, 2)
        trained_pick = head.draft_to_target[head.lm_head(head.norm(outs[0][0])).argmax(-1)]
    served = [(context - 2, tokens[0]) for context, tokens in seen.proposals if tokens]
    agree = sum(int(trained_pick[j]) == t for j, t in served) / len(served)
    assert agree >= 0.9, f"the training unroll's depth-0 picks agree with the served drafts on {agree:.2f}"

    # The training measure counts the positions serving drafts, the answer's, and no others.
    to_draft = torch.full((head.vocab_size,), -1, dtype=torch.long)
    to_draft[head.draft_to_target] = torch.arange(head.draft_vocab)
    cfg = replace(train_head.CHAT_SMOKE, depth=2, batch=1)
    measured = train_head.evaluate(head, target.get_input_embeddings(), {"greedy-chat": cached}, cfg, to_draft)
    assert measured["greedy-chat"]["positions"] == len(answer) - (1 if answer and answer[-1] == eos else 0)
    return {"served_rounds": len(served), "agree": agree, "trained": measured["greedy-chat"]}


@pytest.fixture(scope="module")
def tiny_chat(tmp_path_factory, train_head):
    """A random-initialised chat Llama (4 layers, the bundled tokenizer with a chat template) and
    a random EAGLE-3 head for it, saved where the registry reads heads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specscope.core.loading import bundled_path, load_tokenizer

    folder = tmp_path_factory.mktemp("gap-target")
    tok = load_tokenizer(bundled_path("target"))
    tok.chat_template = TEMPLATE
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.bos_token_id,
        tie_word_embeddings=True,
    )
    target = LlamaForCausalLM(config).eval()
    target.generation_config.eos_token_id = tok.eos_token_id
    vocab = torch.sort(torch.randperm(len(tok))[:512]).values
    head_cfg = train_head.head_config(target, train_head.CHAT_SMOKE, LAYERS, len(vocab))
    head = train_head.new_head(target, head_cfg, vocab)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    out = folder / "head"
    train_head.save_head(head, head_cfg, out)
    return target, tok, out


def test_the_served_head_sees_what_it_was_trained_on_for_a_chat_prompt(train_head, tiny_chat):
    target, tok, head_dir = tiny_chat
    check_gap(train_head, target, tok, head_dir, LAYERS, new_tokens=24)


@pytest.mark.real_model
@pytest.mark.slow
def test_smollm2_head_is_served_what_it_was_trained_on(train_head):
    """The real SmolLM2 and its shipped head (resources/models/eagle3-smollm2), k = 2."""
    from specscope.core.loading import CheckpointError, catalog, load_model, load_tokenizer, models_dir

    try:
        folder = catalog.resolve("smollm2")
    except CheckpointError as exc:
        pytest.skip(f"SmolLM2 is not fetched here: {exc}")
    target = load_model(folder, device="cpu", dtype="float32", role="target")
    tok = load_tokenizer(folder)
    head_dir = models_dir() / "eagle3-smollm2"
    result = check_gap(train_head, target, tok, head_dir, (2, 15, 29), new_tokens=32)
    assert result["served_rounds"] >= 8

"""What the draft heads share: reading a head checkpoint in its authors' format, the one
Llama-style layer a head runs with its own KV cache, and the chain proposer of a recurrent
head (EAGLE, EAGLE-3, MTP: each step feeds its own output back as the next feature).

Positions. The target's feature f_j is its hidden state at context position j (what it read
up to token x_j). A recurrent head's cache entry j pairs f_j with the embedding of x_{j+1},
the token one position ahead, and its output there predicts x_{j+2}. After a round the
target has committed positions 0..c-1 (c = prefix + accepted) and the context ends with
the repair or bonus x_c, so the head's last entry c-1 (f_{c-1}, x_c) predicts the first
draft token x_{c+1}. Each further draft step pairs the head's own output with the token it
just drafted. Those entries were computed from the head's outputs, not the target's
features, so `observe` drops them: after a round the head's cache holds exactly the entries
built from the target's own features of the accepted path, and the next round adds the
newly committed positions from the features the verify forward handed over.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from specscope.core import kernels
from specscope.core.decode.kv import model_vocab_size
from specscope.core.draft.head_folders import HeadFormatError
from specscope.core.draft.heads.trees import HeadGrowth, TreeAttention
from specscope.core.draft.ngram_index import NgramIndex
from specscope.core.draft.proposers import Draft, ProposerBase, TargetMismatch, chain_parents, token_confidence
from specscope.core.draft.tree_draft import finish, grow_dynamic, grow_static
from specscope.core.draft.trees import tree_options
from specscope.core.sampling.device import draft_distribution, sample_from_torch
from specscope.core.sampling.reference import SamplingConfig
from specscope.core.sampling.row_ops import row_argmax

# ---------------------------------------------------------------------------- checkpoints

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def read_weights(folder: Path, kind: str, names: Sequence[str] = WEIGHT_FILES) -> dict[str, torch.Tensor]:
    """The tensors of the first of `names` found in the folder (safetensors or a torch
    pickle, read with weights_only), or of its sharded index (NAME.index.json)."""
    for name in names:
        file, index = folder / name, folder / f"{name}.index.json"
        if file.is_file():
            return _read_file(file, kind)
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, AttributeError) as exc:
                raise HeadFormatError(f"{kind}: {index} is not a weight index ({exc})") from None
            weights: dict[str, torch.Tensor] = {}
            for shard in shards:
                weights.update(_read_file(folder / shard, kind))
            return weights
    raise HeadFormatError(f"{kind}: {folder} holds none of {', '.join(names)}")


def _read_file(file: Path, kind: str) -> dict[str, torch.Tensor]:
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load_file

            return dict(load_file(str(file)))
        loaded = torch.load(str(file), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a truncated or foreign file: one line, not a traceback
        raise HeadFormatError(
            f"{kind}: cannot read {file.name}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise HeadFormatError(f"{kind}: {file.name} is not a state dict of tensors")
    return dict(loaded)


def load_exactly(module: nn.Module, weights: dict[str, torch.Tensor], kind: str, optional: Sequence[str] = ()) -> None:
    """Load `weights` into `module` by name: every name the module has (but `optional`) must
    be there with its shape, and nothing else may be (a foreign format is refused, not
    half-loaded)."""
    expected = module.state_dict()
    missing = [n for n in expected if n not in weights and n not in optional]
    unexpected = [n for n in weights if n not in expected]
    if missing:
        raise HeadFormatError(f"{kind}: the checkpoint lacks {_some(missing)} (is it a {kind} head?)")
    if unexpected:
        raise HeadFormatError(f"{kind}: the checkpoint has weights a {kind} head does not: {_some(unexpected)}")
    for name, tensor in weights.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise HeadFormatError(
                f"{kind}: {name} has shape {tuple(tensor.shape)}, config.json implies {tuple(expected[name].shape)}"
            )
    module.load_state_dict(weights, strict=False)


def _some(names: Sequence[str]) -> str:
    shown = ", ".join(sorted(names)[:4])
    return shown + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def llama_config(config: dict[str, Any], kind: str) -> LlamaConfig:
    """The head's layer shapes as a LlamaConfig (the published heads are Llama layers)."""
    needed = ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [key for key in needed if key not in config]
    if missing:
        raise HeadFormatError(f"{kind}: config.json lacks {', '.join(missing)} (is it a {kind} head?)")
    known = {k: v for k, v in config.items() if k not in ("architectures", "auto_map", "transformers_version")}
    try:
        return LlamaConfig(**known)
    except (TypeError, ValueError) as exc:
        raise HeadFormatError(f"{kind}: config.json does not describe a Llama layer ({exc})") from None


def check_width(kind: str, what: str, head: int, target: int) -> None:
    if head != target:
        raise TargetMismatch(
            f"{kind}: the head's {what} is {head}, the target's is {target}: it was trained for another model"
        )


def target_hidden_size(target: Any) -> int:  # a transformers model (nn.Module has no config)
    return int(target.config.get_text_config().hidden_size)


def target_layers(target: Any) -> int:  # a transformers model
    return int(target.config.get_text_config().num_hidden_layers)


# ---------------------------------------------------------------------------- the head's layer


class HeadNorm(LlamaRMSNorm):
    """LlamaRMSNorm as torch's one `rms_norm` op where input and weight share a dtype (the same
    formula; a draft step runs four of them, and the op-by-op form costs half as much again);
    a mixed-dtype input (autocast) keeps LlamaRMSNorm's own rule."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.dtype != self.weight.dtype:
            normed: torch.Tensor = super().forward(hidden_states)
            return normed
        return F.rms_norm(hidden_states, (hidden_states.shape[-1],), self.weight, self.variance_epsilon)


class HeadKV:
    """One layer's keys and values, (1, kv heads, T, d): appended by a forward, cut by crop.

    They live in buffers that grow by doubling, so an append writes the new entries in place
    instead of copying the whole cache (a draft step appends one entry to hundreds)."""

    def __init__(self) -> None:
        self._keys: torch.Tensor | None = None  # the buffers: rows 0..length-1 are held
        self._values: torch.Tensor | None = None
        self.length = 0

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._keys is None else self._keys[:, :, : self.length]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._values is None else self._values[:, :, : self.length]

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + keys.shape[2]
        old_k, old_v = self._keys, self._values
        if (
            old_k is None
            or old_v is None
            or end > old_k.shape[2]
            or old_k.dtype != keys.dtype
            or old_k.device != keys.device
        ):
            rows = max(64, 2 * end)
            self._keys = keys.new_empty((*keys.shape[:2], rows, keys.shape[3]))
            self._values = values.new_empty((*values.shape[:2], rows, values.shape[3]))
            if old_k is not None and old_v is not None and self.length:
                self._keys[:, :, : self.length].copy_(old_k[:, :, : self.length])
                self._values[:, :, : self.length].copy_(old_v[:, :, : self.length])
        assert self._keys is not None and self._values is not None
        self._keys[:, :, self.length : end].copy_(keys)
        self._values[:, :, self.length : end].copy_(values)
        self.length = end
        return self._keys[:, :, :end], self._values[:, :, :end]

    def crop(self, length: int) -> None:
        self.length = min(self.length, max(0, length))


class HeadAttention(nn.Module):
    """Llama attention (grouped keys/values, rotary positions) whose input is `width` wide:
    the hidden size, or twice it for EAGLE-3's layer, which attends over [embedding; feature].
    `window` (a sliding-window layer, e.g. a speculators EAGLE-3 head's): a query at cache row r
    sees rows r - window + 1 .. r only (chains; a tree's mask is used as given)."""

    window: int | None = None

    def __init__(self, config: LlamaConfig, width: int):
        super().__init__()
        self.heads, self.kv_heads = (
            int(config.num_attention_heads),
            int(config.num_key_value_heads or config.num_attention_heads),
        )
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        bias = bool(getattr(config, "attention_bias", False))
        self.q_proj = nn.Linear(width, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(width, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=bias)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kv: HeadKV, allowed: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x: (1, n, width), the n newest entries after what kv holds. `allowed` (n, held + n)
        bool: the cache rows, then the new entries, each attends (tree nodes); None: causal."""
        n = x.shape[1]
        q = self.q_proj(x).view(1, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(1, n, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *rope)
        keys, values = kv.append(k, v)
        total = keys.shape[2]
        groups = self.heads // self.kv_heads
        if groups > 1:
            keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
        seen: torch.Tensor | None
        if allowed is None and n == 1 and (self.window is None or total <= self.window):
            seen = None  # the newest entry sees every row: no mask to build
        elif allowed is None:  # causal: query i (at cache row total - n + i) sees rows 0 .. total - n + i
            rows = (total - n + torch.arange(n, device=x.device))[:, None]
            seen = torch.arange(total, device=x.device)[None, :] <= rows
            if self.window is not None:
                seen = seen & (torch.arange(total, device=x.device)[None, :] > rows - self.window)
        elif tuple(allowed.shape) != (n, total):
            raise RuntimeError(
                f"a head tree mask of shape {tuple(allowed.shape)} for {n} entries after {total - n} held"
            )
        else:
            seen = allowed
        out = nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=seen)
        projected: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(1, n, self.heads * self.head_dim))
        return projected


class HeadLayer(nn.Module):
    """A Llama decoder layer with its own cache. `forward(attn_in, residual)`: residual +
    attention(attn_in), then residual + MLP(norm(...)). A plain Llama layer passes
    attn_in = input_layernorm(x), residual = x (`plain`); EAGLE's first layer has no
    input_layernorm, EAGLE-3's builds attn_in from two normed halves."""

    def __init__(self, config: LlamaConfig, width: int | None = None, input_norm: bool = True):
        super().__init__()
        self.self_attn = HeadAttention(config, width or config.hidden_size)
        self.mlp = LlamaMLP(config)
        if input_norm:
            self.input_layernorm = HeadNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = HeadNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        attn_in: torch.Tensor,
        residual: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv: HeadKV,
        at: TreeAttention | None = None,
    ) -> torch.Tensor:
        x = residual + self.self_attn(attn_in, rope, kv, None if at is None else at.allowed)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out

    def plain(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kv: HeadKV, at: TreeAttention | None = None
    ) -> torch.Tensor:
        norm = getattr(self, "input_layernorm", None)
        return self.forward(norm(x) if norm is not None else x, x, rope, kv, at)


STATIC_ROPE = ("default", "linear", "llama3")  # rotary types whose table at a position does not depend on the length


class RecurrentHead(nn.Module):
    """A head that drafts by feeding its own output back (EAGLE, EAGLE-3, MTP). A kind
    gives `feature_layers`, `attach` (check the target, share its embedding / output head),
    `step` (pairs of features and next tokens -> the head's outputs, appended to its cache,
    causally or as tree nodes)
    and `logits` (over `draft_to_target`'s ids when the head has its own smaller vocabulary)."""

    kind = "head"

    def __init__(self, config: LlamaConfig, layers: int = 1):
        super().__init__()
        self.rope = LlamaRotaryEmbedding(config)
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None  # _rope_table's cache
        self.kvs = [HeadKV() for _ in range(layers)]
        self.shared: dict[str, nn.Module] = {}  # the target's modules the head uses (not its own weights)
        self.vocab_size = int(config.vocab_size)  # the target vocabulary the head was trained with
        self.draft_to_target: torch.Tensor | None = None  # a reduced vocabulary's ids in the target's
        self._draft_ids: tuple[torch.Tensor, dict[int, int]] | None = None  # draft_ids()'s cache

    @property
    def length(self) -> int:
        return self.kvs[0].length

    def draft_ids(self) -> dict[int, int] | None:
        """target id -> draft id for a reduced vocabulary (None without one), built once."""
        to_target = self.draft_to_target
        if to_target is None:
            return None
        if self._draft_ids is None or self._draft_ids[0] is not to_target:
            self._draft_ids = (to_target, {int(t): i for i, t in enumerate(to_target.tolist())})
        return self._draft_ids[1]

    def crop(self, length: int) -> None:
        for kv in self.kvs:
            kv.crop(length)

    def reset(self) -> None:
        self.kvs = [HeadKV() for _ in self.kvs]

    def positions(
        self, start: int, n: int, like: torch.Tensor, at: TreeAttention | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary tables of n new entries: at cache rows start.. (a chain), or at the
        positions a tree step names."""
        tabled = not torch.is_grad_enabled() and self.rope.rope_type in STATIC_ROPE  # not training
        if not tabled:
            ids = torch.arange(start, start + n, device=like.device)[None] if at is None else at.positions[None]
            tables: tuple[torch.Tensor, torch.Tensor] = self.rope(like, ids)
            return tables
        end = start + n if at is None else int(at.positions.max()) + 1
        cos, sin = self._rope_table(end, like)
        if at is None:
            return cos[:, start : start + n], sin[:, start : start + n]
        return cos[:, at.positions], sin[:, at.positions]

    def _rope_table(self, end: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary tables of positions 0..end-1 at least, computed once and grown by doubling:
        each position's row is what `self.rope` gives it alone (elementwise in the position),
        looked up instead of recomputed at every draft step."""
        table = self._rope
        if table is None or table[0].shape[1] < end or table[0].dtype != like.dtype or table[0].device != like.device:
            ids = torch.arange(max(256, 2 * end), device=like.device)[None]
            table = self._rope = self.rope(like, ids)
        return table

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        own = getattr(self, "embed_tokens", None)
        embedded: torch.Tensor = (own if own is not None else self.shared["embed"])(tokens)
        return embedded

    def place(self, target: nn.Module) -> None:
        """Onto the target's device and dtype (the features come in those), and onto the
        few-row linear kernel where the target is on it (core.kernels)."""
        param = next(target.parameters())
        self.to(device=param.device, dtype=param.dtype)
        if kernels.installed(target):
            kernels.install(self)

    def feature_layers(self, target_layers: int) -> tuple[int, ...]:
        raise NotImplementedError

    def attach(self, target: nn.Module) -> None:
        raise NotImplementedError

    def step(
        self, features: torch.Tensor, tokens: torch.Tensor, from_target: bool, at: TreeAttention | None = None
    ) -> torch.Tensor:
        """(1, n, F) features and (1, n) next tokens -> (1, n, H) outputs, appended to the
        cache; `at` places them as tree nodes (else causally after the cache)."""
        raise NotImplementedError

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


def target_output_embeddings(target: Any) -> nn.Module:  # a transformers model: its lm_head
    head: nn.Module = target.get_output_embeddings()
    return head


def share_embedding(head: RecurrentHead, target: Any) -> None:  # a transformers model
    if getattr(head, "embed_tokens", None) is None:
        head.shared["embed"] = target.get_input_embeddings()


# ---------------------------------------------------------------------------- drafting


class HeadDrafting(ProposerBase):
    """What every head proposer shares: the target it reads, the features handed over after
    each round, drawing a token from a head's logits (greedy argmax, or a sample from q
    reported exactly as it was drawn from; by the coupling's keys when coupled; or, with
    draw="onehot", q's top token reported as a point mass), and the token tree it drafts
    instead of a chain, if any (`draft_trees`; core.draft.heads.trees)."""

    name = "head"

    def __init__(self, label: str):
        self.label = label
        # How a draft token is drawn at T > 0 (the registry's `draw` parameter): "sampled" from q,
        # the head's distribution after the sampling transforms; or "onehot", q's top token
        # reported as a point mass, as servers did that treated T > 0 drafts as one-hot (vLLM
        # #40149): still exact (accepted with p(x), the residual is p without x), accepted less.
        self.draw_mode = "sampled"
        # EAGLE-2 style early stop (the registry's `stop`): a chain ends once the product of the
        # head's own probabilities of its tokens falls below this; None drafts all k
        self.stop_below: float | None = None
        # Prompt lookup first (the registry's `lookup`): a chain round copies what followed an
        # earlier occurrence of the context's last n tokens, and the head drafts only where there
        # is none. The choice reads the context alone, so each round's q is still the law its
        # tokens were drawn from (a point mass for copied tokens): exact as any proposer.
        self.lookup: NgramIndex | None = None
        self.spec = f"{self.name}:{label}"
        self.tree: Any = None  # a core.draft.trees.TreeSpec when the head drafts trees
        self.children = "topk"
        self.hint = ""  # added to a TargetMismatch message (the bundled head: which target it is for)
        self.coupling: Any = None
        self._prompt_len = 0
        self.vocab_size = 0
        self._features: torch.Tensor | None = None  # (m, F) handed over, not yet fed to the head
        self._feature_end = 0  # features are known for context positions < this

    def bind(self, vocab_size: int, use_cache: bool) -> None:
        if self.vocab_size and self.vocab_size != vocab_size:
            raise TargetMismatch(f"{self.name}: the head predicts {self.vocab_size} tokens, the target {vocab_size}")
        self.vocab_size = vocab_size

    def couple(self, coupling: Any, prompt_len: int) -> None:
        self.coupling, self._prompt_len = coupling, int(prompt_len)

    def draft_trees(self, tree: Any, children: str = "topk") -> None:
        """Draft token trees of this spec (core.draft.trees: "3,2,1", "paths:...",
        "dynamic:nodes=N,depth=D,topk=K"), siblings chosen by `children`; None: chains.
        ValueError (one line) for a spec or mode the draft model would refuse too."""
        self.tree, self.children = tree_options(tree, children)

    @property
    def tree_children(self) -> str | None:
        """A tree draft's children mode (None for a chain): what the verifier and the checker read."""
        return None if self.tree is None else self.children

    def use_lookup(self, ngram: int | None) -> None:
        """Prompt lookup first for n-grams of `ngram` to `ngram` + 2 tokens (longest first); None: the head always."""
        self.lookup = None if ngram is None else NgramIndex(ngram, ngram + 2)

    def params(self) -> dict[str, Any]:
        trees = {"tree": str(self.tree), "children": self.children} if self.tree is not None else {}
        stop = {} if self.stop_below is None else {"stop": self.stop_below}
        lookup = {} if self.lookup is None else {"lookup": self.lookup.min_ngram}
        return {"head": self.label, "draw": self.draw_mode, **trees, **stop, **lookup}

    def reset(self) -> None:
        self._features, self._feature_end = None, 0
        if self.lookup is not None:
            self.lookup.reset()

    def copied(
        self, context: Sequence[int], k: int, sampling: SamplingConfig, device: Any, cache: int | None
    ) -> Draft | None:
        """Prompt lookup's chain for this round (tokens and, at T > 0, their point masses), or
        None when lookup is off or finds no earlier occurrence."""
        if self.lookup is None:
            return None
        tokens = self.lookup.lookup(context, k)
        if not tokens:
            return None
        q = None
        if not sampling.greedy:
            q = torch.zeros((len(tokens), self.vocab_size), dtype=torch.float64, device=device)
            q[torch.arange(len(tokens)), torch.as_tensor(tokens)] = 1.0
        return Draft(tuple(tokens), chain_parents(len(tokens)), q, cache_before=cache, cache_peak=cache)

    def take_features(self, first_position: int, features: torch.Tensor) -> None:
        """Append the new positions' features (their layers concatenated, low to high);
        positions already known (a run without a target cache re-feeds them) are skipped."""
        if first_position > self._feature_end:
            raise RuntimeError(
                f"{self.name}: features start at position {first_position} but only "
                f"{self._feature_end} are known: a gap the head cannot fill"
            )
        flat = features.reshape(features.shape[0], -1)[self._feature_end - first_position :]
        if flat.shape[0]:
            self._features = flat if self._features is None else torch.cat([self._features, flat])
            self._feature_end = first_position + features.shape[0]

    def draw(
        self,
        logits: torch.Tensor,
        sampling: SamplingConfig,
        rng: np.random.Generator,
        position: int,
        to_target: torch.Tensor | None,
    ) -> tuple[int, torch.Tensor | None, float | None]:
        """One token from a row of head logits: (target id, q over the target vocabulary or
        None when greedy, the uniform used or None). A reduced vocabulary's q is placed at
        its target ids (zero elsewhere): the distribution the token was drawn from."""
        if sampling.greedy:
            if not bool(torch.isfinite(logits).all()):
                raise ValueError(f"the {self.name} head produced non-finite logits; refusing to propose")
            pick = int(row_argmax(logits))
            return (pick if to_target is None else int(to_target[pick])), None, None
        q = draft_distribution(logits, sampling)
        if to_target is not None:
            q = torch.zeros(self.vocab_size, dtype=torch.float64, device=q.device).index_copy_(0, to_target, q)
        if self.draw_mode == "onehot":  # q's top token, and the point mass it is then drawn from
            pick = int(row_argmax(q))
            point = torch.zeros_like(q)
            point[pick] = 1.0
            return pick, point, None
        if self.coupling is not None:
            return self.coupling.pick(q, position), q, None
        u = float(rng.random())
        return sample_from_torch(q, u), q, u


def tree_draft(
    growth: Any, kept: list[int], sampling: SamplingConfig, children: str, before: int | None, peak: int | None
) -> Draft:
    """The Draft of a grown tree's kept candidates."""
    tokens, parents, qs, _ = finish(growth, kept)
    return Draft(
        tokens=tokens,
        parents=parents,
        q=None if sampling.greedy or not qs else torch.stack(qs),
        forwards=growth.forwards,
        cache_before=before,
        cache_peak=peak,
        sample_draws=tuple(growth.draws),
        children=children,
        confidence=growth.confidence(kept),
    )


def head_confidence(logits: torch.Tensor, token: int, draft_ids: dict[int, int] | None) -> torch.Tensor:
    """The head's own probability for the target token it proposed, from the untransformed
    softmax of its logits (over its own vocabulary when it has a reduced one, whose ids
    `draft_ids` maps: RecurrentHead.draft_ids): a device scalar."""
    if draft_ids is None:
        return token_confidence(logits, token)
    probs = torch.softmax(logits.reshape(-1).double(), dim=-1)
    at = draft_ids.get(token)
    return probs[at] if at is not None else probs.new_zeros(())


def make_draft(
    tokens: list[int],
    qs: list[torch.Tensor],
    draws: list[float],
    forwards: int,
    before: int | None,
    peak: int | None,
    confidence: Sequence[torch.Tensor] = (),
    children: str | None = None,
) -> Draft:
    """A chain draft; `confidence` holds one device scalar per token (head_confidence), moved
    to the host in one transfer."""
    return Draft(
        tokens=tuple(tokens),
        parents=chain_parents(len(tokens)),
        q=torch.stack(qs) if qs else None,
        forwards=forwards,
        cache_before=before,
        cache_peak=peak,
        sample_draws=tuple(draws),
        children=children,
        confidence=tuple(torch.stack(list(confidence)).tolist()) if len(confidence) else (),
    )


class RecurrentHeadProposer(HeadDrafting):
    """A chain of k tokens from a recurrent head (module docstring: the positions)."""

    def __init__(self, head: RecurrentHead, label: str):
        self.name = head.kind
        super().__init__(label)
        self.head = head
        self._real = 0  # head cache entries built from the target's own features

    def target_features(self, target: nn.Module) -> tuple[int, ...]:
        try:
            self.head.attach(target)
            self.vocab_size = model_vocab_size(target)
            check_width(self.name, "vocabulary", self.head.vocab_size, self.vocab_size)
            return self.head.feature_layers(target_layers(target))
        except TargetMismatch as exc:
            if not self.hint:
                raise
            raise TargetMismatch(f"{exc}; {self.hint}") from None

    def reset(self) -> None:
        super().reset()
        self.head.reset()
        self._real = 0

    @property
    def cache_length(self) -> int | None:
        return self.head.length

    @torch.inference_mode()
    def propose(self, context: Sequence[int], k: int, sampling: SamplingConfig, rng: np.random.Generator) -> Draft:
        """A chain of k tokens, or with a tree, a tree at most k deep."""
        before = self.head.length
        if self._feature_end == 0:  # the prefill round: the target has read nothing yet
            return make_draft([], [], [], 0, before, before, children=self.tree_children)
        if self.tree is None and self.lookup is not None:  # the device is read only when lookup is on
            copied = self.copied(context, k, sampling, next(self.head.parameters()).device, before)
            if copied is not None:  # the head is not run: its pending features are fed next round
                return copied
        hidden = self._feed_real(context)
        if self.tree is not None:
            return self._propose_tree(hidden, context, k, sampling, rng, before)
        device = hidden.device
        tokens: list[int] = []
        qs: list[torch.Tensor] = []
        draws: list[float] = []
        confidence: list[torch.Tensor] = []
        path = 1.0  # the head's probability of the path so far (with stop_below)
        for i in range(k):
            logits = self.head.logits(hidden)
            token, q, u = self.draw(
                logits, sampling, rng, len(context) - self._prompt_len + i, self.head.draft_to_target
            )
            confidence.append(head_confidence(logits, token, self.head.draft_ids()))
            tokens.append(token)
            if q is not None:
                qs.append(q)
            if u is not None:
                draws.append(u)
            if self.stop_below is not None and i + 1 < k:
                # decided after the token is kept, from the drafted path alone: the verify rules
                # stay exact (a token is never dropped for what it is, which would bias q)
                path *= float(confidence[-1])
                if path < self.stop_below:
                    break
            if i + 1 < k:  # the head's own output is the next step's feature
                fed = torch.tensor([[token]], dtype=torch.long, device=device)
                hidden = self.head.step(hidden[None, None], fed, from_target=False)[0, -1]
        return make_draft(tokens, qs, draws, len(tokens), before, self.head.length, confidence)

    def _feed_real(self, context: Sequence[int]) -> torch.Tensor:
        """Feed the features handed over since the last round (paired with the tokens one
        position ahead) as real entries; the output at the last one, which predicts the
        first draft token."""
        if self._feature_end != len(context) - 1:
            raise RuntimeError(
                f"{self.name}: features are known up to position {self._feature_end}, but the "
                f"context has {len(context)} tokens (the decoder must hand over every committed position)"
            )
        start = self.head.length
        features = cast(torch.Tensor, self._features)  # take_features set them (checked just above)
        nexts = torch.tensor(list(context[start + 1 :]), dtype=torch.long, device=features.device)
        hidden = self.head.step(features[None], nexts[None], from_target=True)[0, -1]
        self._features, self._real = None, self.head.length
        return hidden

    def _propose_tree(
        self,
        hidden: torch.Tensor,
        context: Sequence[int],
        depth: int,
        sampling: SamplingConfig,
        rng: np.random.Generator,
        before: int,
    ) -> Draft:
        growth = HeadGrowth(self.head, hidden, self.vocab_size, len(context), sampling, rng)
        growth.forwards = 1  # the real entries' step gave the root
        if self.tree.kind == "dynamic":
            kept = grow_dynamic(growth, self.tree, depth, growth.root_q(), self.tree_policy)
        else:
            kept = grow_static(growth, self.tree, self.children, depth, growth.root_q())
        return tree_draft(growth, kept, sampling, self.children, before, self.head.length)

    def keep_path(self, path: Sequence[int]) -> None:
        """After a tree round: every node's entry was built from the head's outputs, so the
        cache keeps the real entries only (the accepted path's come from the target's
        features next round, as after a chain)."""
        if self.tree is not None:
            self.head.crop(self._real)

    def observe(self, committed_len: int) -> int | None:
        """Drop the entries the draft steps added (built from the head's outputs): the cache
        keeps the accepted path's entries built from the target's features."""
        self.head.crop(min(self._real, committed_len))
        self._real = self.head.length
        return self.head.length

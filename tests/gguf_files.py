"""GGUF files written by the tests themselves (the gguf package): a tiny random Llama with a
byte-level BPE tokenizer in its metadata, and files transformers cannot read."""

from __future__ import annotations

from pathlib import Path

import numpy as np

VOCAB_EXTRA = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def _byte_alphabet() -> list[str]:
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return [bytes_to_unicode()[b] for b in range(256)]


def tokenizer_metadata() -> tuple[list[str], list[int], list[str]]:
    """Tokens (256 bytes, a few merged pairs, the special tokens), their types, the merges."""
    alphabet = _byte_alphabet()
    space = alphabet[ord(" ")]
    merges = [f"{space} t", "h e", f"{space}t h", "i n", "e r", f"{space} a"]
    merged = [m.replace(" ", "") for m in merges]
    tokens = alphabet + merged + list(VOCAB_EXTRA)
    types = [1] * (len(alphabet) + len(merged)) + [3] * len(VOCAB_EXTRA)  # 1 normal, 3 control
    return tokens, types, merges


def write_tiny_llama(
    path: Path,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int = 64,
    context: int = 256,
) -> Path:
    """A random-initialised Llama in float32 GGUF, its tokenizer in the metadata."""
    import gguf

    tokens, types, merges = tokenizer_metadata()
    vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama-test")
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|endoftext|>"))
    head_dim = hidden // heads
    writer.add_tensor("token_embd.weight", w(vocab, hidden, scale=1.0))
    writer.add_tensor("output_norm.weight", 1 + w(hidden, scale=0.05))
    writer.add_tensor("output.weight", w(vocab, hidden))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", 1 + w(hidden, scale=0.05))
        writer.add_tensor(f"blk.{i}.attn_q.weight", w(heads * head_dim, hidden))
        writer.add_tensor(f"blk.{i}.attn_k.weight", w(kv_heads * head_dim, hidden))
        writer.add_tensor(f"blk.{i}.attn_v.weight", w(kv_heads * head_dim, hidden))
        writer.add_tensor(f"blk.{i}.attn_output.weight", w(hidden, heads * head_dim))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", 1 + w(hidden, scale=0.05))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", w(ffn, hidden))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", w(ffn, hidden))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", w(hidden, ffn))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_unsupported(path: Path, arch: str = "bert") -> Path:
    """A well-formed GGUF of an architecture transformers does not read from GGUF."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

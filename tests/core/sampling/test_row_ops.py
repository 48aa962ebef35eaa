"""core.sampling.row_ops: the chunked topk and argmax equal torch's on every kind of row."""

import pytest
import torch

from specscope.core.sampling.row_ops import MIN_VOCAB, nonzero_entries, row_argmax, row_topk


def _rows(kind: str, m: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "normal":
        return torch.randn(m, vocab, generator=g) * 3
    if kind == "ties":  # few distinct values: many ties everywhere, including the maximum
        return torch.randint(0, 4, (m, vocab), generator=g).to(torch.float32)
    if kind == "sparse":  # a top-k filtered probability row: mostly zeros
        rows = torch.zeros(m, vocab, dtype=torch.float64)
        for r in range(m):
            ids = torch.randperm(vocab, generator=g)[:50]
            rows[r, ids] = torch.rand(50, generator=g, dtype=torch.float64)
        return rows
    if kind == "masked":  # logits after a top-k mask: -inf outside the kept set
        rows = torch.full((m, vocab), float("-inf"))
        for r in range(m):
            ids = torch.randperm(vocab, generator=g)[:40]
            rows[r, ids] = torch.randn(40, generator=g)
        return rows
    if kind == "max-at-end":  # the maximum in the padded tail chunk
        rows = torch.randn(m, vocab, generator=g)
        rows[:, -1] = 100.0
        return rows
    raise ValueError(kind)


KINDS = ["normal", "ties", "sparse", "masked", "max-at-end"]
VOCABS = [4096, MIN_VOCAB, MIN_VOCAB + 37, 151_936]  # below MIN_VOCAB: torch's own kernels


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("vocab", VOCABS)
def test_argmax_is_the_first_maximal_entry(kind, vocab):
    rows = _rows(kind, 5, vocab, seed=vocab)
    assert torch.equal(row_argmax(rows), rows.argmax(dim=-1))
    assert int(row_argmax(rows[2])) == int(rows[2].argmax())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("k", [1, 21, 51])
def test_topk_values_equal_torch_and_ids_point_at_them(kind, vocab, k):
    rows = _rows(kind, 4, vocab, seed=k + vocab)
    values, ids = row_topk(rows, k)
    expected = torch.topk(rows, k, dim=-1).values
    assert torch.equal(values, expected)
    assert torch.equal(torch.gather(rows, 1, ids), values)  # each id holds its value
    assert all(len(set(r.tolist())) == k for r in ids)  # no entry counted twice


def test_one_dimensional_rows_and_small_vocabularies_use_torch_semantics():
    row = _rows("normal", 1, 100, seed=1)[0]
    values, ids = row_topk(row, 7)
    assert torch.equal(values, torch.topk(row, 7).values) and torch.equal(row[ids], values)
    assert int(row_argmax(row)) == int(row.argmax())


def test_distinct_values_give_torchs_ids_too():
    rows = torch.randperm(151_936, generator=torch.Generator().manual_seed(3)).to(torch.float64).reshape(1, -1)
    values, ids = row_topk(rows, 30)
    ref_values, ref_ids = torch.topk(rows, 30, dim=-1)
    assert torch.equal(values, ref_values) and torch.equal(ids, ref_ids)


@pytest.mark.parametrize("kind", ["sparse", "ties"])
@pytest.mark.parametrize("vocab", VOCABS + [100])
def test_nonzero_entries_of_nonnegative_rows_equal_torchs(kind, vocab):
    rows = _rows(kind, 3, vocab, seed=vocab + 7).to(torch.float64)
    rows[1] = 0.0  # a row with no entry at all
    rows[2, -1] = 0.5  # an entry in the last (padded) chunk
    row_of, ids = nonzero_entries(rows)
    expected = torch.nonzero(rows)
    assert torch.equal(row_of, expected[:, 0]) and torch.equal(ids, expected[:, 1])

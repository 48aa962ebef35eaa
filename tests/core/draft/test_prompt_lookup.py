from specscope.core import PromptLookupProposer, SamplingConfig


def test_longest_suffix_match_proposes_what_followed():
    assert PromptLookupProposer(max_ngram=8).lookup([1, 2, 3, 4, 1, 2], k=2) == [3, 4]


def test_no_match_proposes_nothing():
    assert PromptLookupProposer().lookup([1, 2, 3], k=2) == []
    assert PromptLookupProposer().lookup([7], k=2) == []


def test_most_recent_earlier_match_wins():
    # The suffix [5] occurs at positions 0 and 3; the later one is followed by 9.
    assert PromptLookupProposer(max_ngram=1).lookup([5, 8, 1, 5, 9, 2, 5], k=1) == [9]


def test_longer_ngram_beats_a_more_recent_shorter_one():
    tokens = [1, 2, 3, 7, 9, 2, 3, 8, 1, 2, 3]
    # 3-gram [1,2,3] matches at 0 (followed by 7); 2-gram [2,3] more recently at 5 (followed by 8).
    assert PromptLookupProposer(max_ngram=3).lookup(tokens, k=1) == [7]
    assert PromptLookupProposer(max_ngram=2).lookup(tokens, k=1) == [8]


def test_min_ngram_refuses_short_matches():
    tokens = [4, 1, 9, 1]
    assert PromptLookupProposer(max_ngram=3, min_ngram=1).lookup(tokens, k=2) == [9, 1]
    assert PromptLookupProposer(max_ngram=3, min_ngram=2).lookup(tokens, k=2) == []


def test_proposal_is_capped_at_k_and_at_the_context_end():
    tokens = [1, 2, 3, 4, 5, 1]
    assert PromptLookupProposer().lookup(tokens, k=3) == [2, 3, 4]
    assert PromptLookupProposer().lookup([1, 2, 1], k=5) == [2, 1]


def test_q_is_a_point_mass_on_each_proposed_token():
    import numpy as np

    proposer = PromptLookupProposer(vocab_size=10)
    draft = proposer.propose([1, 2, 3, 1, 2], 2, SamplingConfig(), np.random.default_rng(0))
    assert draft.tokens == (3, 1)
    assert draft.q.shape == (2, 10)
    assert draft.q[0, 3] == 1.0 and draft.q[1, 1] == 1.0 and draft.q.sum() == 2.0
    greedy = proposer.propose([1, 2, 3, 1, 2], 2, SamplingConfig(temperature=0), np.random.default_rng(0))
    assert greedy.q is None

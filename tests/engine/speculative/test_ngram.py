"""Prompt lookup proposes from the sequence's own tokens, longest recurring suffix first."""

from __future__ import annotations

import pytest

from engine.speculative.ngram import NgramProposer


def test_proposes_what_followed_the_last_occurrence_of_the_suffix() -> None:
    proposer = NgramProposer(min_n=2, max_n=3)
    tokens = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7]
    assert proposer.lookup(tokens, 3) == [8, 9, 1]
    assert proposer.lookup(tokens, 1) == [8]


def test_the_most_recent_occurrence_wins() -> None:
    proposer = NgramProposer(min_n=2, max_n=2)
    tokens = [1, 2, 3, 4, 1, 2, 7, 8, 1, 2]
    assert proposer.lookup(tokens, 2) == [7, 8]


def test_longer_suffix_is_preferred_over_a_more_recent_short_one() -> None:
    proposer = NgramProposer(min_n=2, max_n=4)
    # "3 1 2" recurs at the start (followed by 9); "1 2" alone recurs later (followed by 4).
    tokens = [3, 1, 2, 9, 9, 1, 2, 4, 0, 3, 1, 2]
    assert proposer.lookup(tokens, 1) == [9]


def test_no_recurring_suffix_gives_no_draft() -> None:
    proposer = NgramProposer(min_n=2, max_n=4)
    assert proposer.lookup([1, 2, 3, 4, 5, 6], 4) == []
    assert proposer.lookup([1], 4) == []
    assert proposer.lookup([1, 2, 1, 2], 0) == []


def test_a_match_straddling_two_tokens_is_not_taken() -> None:
    # Ids whose bytes line up across a token boundary: 0x00000100 then 0x00000002 holds
    # the bytes of 0x00020000 one byte in; only aligned matches count.
    proposer = NgramProposer(min_n=1, max_n=1)
    tokens = [0x100, 0x2, 7, 0x20000]
    assert proposer.lookup(tokens, 2) == []


def test_draft_stops_at_the_end_of_the_history() -> None:
    proposer = NgramProposer(min_n=2, max_n=2)
    assert proposer.lookup([4, 5, 6, 4, 5], 8) == [6, 4, 5]


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="min_n"):
        NgramProposer(min_n=0, max_n=2)
    with pytest.raises(ValueError, match="min_n"):
        NgramProposer(min_n=3, max_n=2)


def test_a_repeating_run_gets_a_full_draft() -> None:
    proposer = NgramProposer(min_n=2, max_n=4)
    # The latest "7 7" is followed by one token only; an earlier one has k after it.
    assert proposer.lookup([1, 2, 7, 7, 7, 7, 7, 7], 4) == [7, 7, 7, 7]
    assert proposer.lookup([1, 2, 3, 1, 2, 3, 1, 2], 4) == [3, 1, 2, 3]

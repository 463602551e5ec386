"""producer/engines/hf_prefix.py: the prompts' common prefix the hf engine prefills once."""

from __future__ import annotations

from producer.engines.hf_prefix import PrefixCache, common_prefix


def test_the_common_prefix_is_the_longest_every_prompt_starts_with():
    assert common_prefix([[1, 2, 3, 4], [1, 2, 3, 9], [1, 2, 3]]) == [1, 2, 3]
    assert common_prefix([[1, 2], [3]]) == []
    assert common_prefix([[5, 6]]) == [5, 6]
    assert common_prefix([]) == []


def test_the_prefix_is_learned_from_prompts_admitted_together_and_shortened_by_later_ones():
    cache = PrefixCache(min_tokens=3)
    cache.observe([[1, 2, 3, 4, 5]])  # one prompt alone says nothing
    assert cache.ids == []
    cache.observe([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7]])
    assert cache.ids == [1, 2, 3, 4]
    assert cache.fits([1, 2, 3, 4, 9])
    assert not cache.fits([1, 2, 3, 4])  # nothing left to prefill after it
    assert not cache.fits([1, 2, 8, 4, 9])
    cache.observe([[1, 2, 3, 8]])  # a later prompt that differs earlier
    assert cache.ids == [1, 2, 3]
    assert cache.fits([1, 2, 3, 4, 9])
    cache.observe([[7, 8]])
    assert cache.ids == []
    assert not cache.fits([7, 8, 9])


def test_a_prefix_shorter_than_the_minimum_is_not_used():
    cache = PrefixCache(min_tokens=8)
    cache.observe([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6]])
    assert cache.ids == [1, 2, 3, 4]
    assert not cache.fits([1, 2, 3, 4, 7])

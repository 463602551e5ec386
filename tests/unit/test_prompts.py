"""PromptOrder (epochs, seeded shuffles, retries, exhaustion, state) and the prompt sources
(the data files they read: tests/unit/test_task_data.py)."""

from __future__ import annotations

import json

import pytest

from common.config import TaskConfig
from consumer.data.prompts import PromptOrder, RowSource, SyntheticSource, make_source
from consumer.data.rows import PromptRow


def take(order: PromptOrder, n: int) -> list[int | None]:
    return [order.next() for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# PromptOrder


def test_without_shuffle_epochs_repeat_the_prompts_in_order():
    order = PromptOrder(4, seed=0, shuffle=False, epochs=0)
    assert take(order, 10) == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert (order.epoch, order.position) == (2, 2)


def test_each_shuffled_epoch_is_a_permutation():
    n = 50
    order = PromptOrder(n, seed=3, shuffle=True, epochs=0)
    epochs = [take(order, n) for _ in range(3)]
    for epoch in epochs:
        assert sorted(epoch) == list(range(n))
    assert epochs[0] != list(range(n))
    assert len({tuple(e) for e in epochs}) == 3  # a fresh permutation every epoch


def test_the_shuffle_is_determined_by_the_seed():
    a = take(PromptOrder(30, seed=7, shuffle=True, epochs=0), 90)
    b = take(PromptOrder(30, seed=7, shuffle=True, epochs=0), 90)
    c = take(PromptOrder(30, seed=8, shuffle=True, epochs=0), 90)
    assert a == b
    assert a != c


def test_retries_are_served_before_new_prompts_in_requeue_order():
    order = PromptOrder(10, seed=0, shuffle=False, epochs=0)
    assert take(order, 3) == [0, 1, 2]
    order.requeue(1)
    order.requeue(0)
    assert take(order, 4) == [1, 0, 3, 4]


def test_a_finite_run_is_exhausted_after_its_epochs():
    order = PromptOrder(3, seed=0, shuffle=True, epochs=2)
    got = take(order, 6)
    assert sorted(got[:3]) == sorted(got[3:]) == [0, 1, 2]
    assert order.exhausted()
    assert order.next() is None
    assert order.next() is None


def test_a_requeued_prompt_is_served_even_after_exhaustion():
    order = PromptOrder(2, seed=0, shuffle=False, epochs=1)
    assert take(order, 3) == [0, 1, None]
    order.requeue(1)
    assert not order.exhausted()
    assert take(order, 2) == [1, None]
    assert order.exhausted()


def test_zero_epochs_means_unlimited():
    order = PromptOrder(2, seed=0, shuffle=True, epochs=0)
    assert None not in take(order, 1000)
    assert not order.exhausted()


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("advance", [0, 5, 7, 13])
def test_state_round_trip_continues_with_the_same_prompts(shuffle, advance):
    original = PromptOrder(7, seed=11, shuffle=shuffle, epochs=3)
    take(original, advance)
    original.requeue(4)
    state = json.loads(json.dumps(original.state_dict()))  # what a checkpoint stores
    restored = PromptOrder(7, seed=11, shuffle=shuffle, epochs=3)
    restored.load_state_dict(state)
    assert take(restored, 25) == take(original, 25)


# ---------------------------------------------------------------------------------------------
# Sources


def test_make_source_picks_the_configured_source_and_sizes_its_rows(tmp_path):
    path = tmp_path / "p.jsonl"
    rows = [{"prompt": "a", "answer": "b"}, {"prompt": "longer", "answer": "c", "n": 1}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    source = make_source(TaskConfig(source="jsonl", path=str(path)), seed=0)
    assert isinstance(source, RowSource)
    assert len(source) == 2
    assert source.get(1) == PromptRow("longer", "c", (), '{"n":1}')
    assert source.max_row_bytes == len("longer") + len("c") + len('{"n":1}')
    assert not source.has_chat
    assert isinstance(make_source(TaskConfig(), seed=0), SyntheticSource)


def test_the_synthetic_source_is_deterministic_per_seed_and_index():
    a, b = SyntheticSource(seed=0), SyntheticSource(seed=0)
    assert [a.get(i) for i in (0, 1, 999)] == [b.get(i) for i in (0, 1, 999)]
    row = a.get(5)
    assert row.prompt
    assert row.answer
    assert (row.messages, row.columns) == ((), "")
    assert row.num_bytes <= SyntheticSource.max_row_bytes

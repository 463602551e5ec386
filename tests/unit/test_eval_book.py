"""consumer/evaluation/rounds.py: eval rounds and their leases, driven by hand (no sockets)."""

from __future__ import annotations

import numpy as np
import pytest

from common import wire
from common.task.pass_at_k import pass_at_k
from consumer.evaluation.rounds import EVAL_BIT, EvalBook

K = 2


def book(num_prompts: int = 3, *, every: int = 5) -> tuple[EvalBook, list[tuple[str, wire.Ack]]]:
    acks: list[tuple[str, wire.Ack]] = []
    b = EvalBook(
        num_prompts, every_steps=every, samples=K, pass_reward=1.0,
        ack=lambda p, a: acks.append((p, a)),
    )  # fmt: skip
    return b, acks


def answer(lease, rewards: list[float], *, version: int | None = None, producer: str = "p"):
    lens = np.full(len(rewards), 3, np.int32)
    return wire.Group(
        lease_id=lease.lease_id, producer_id=producer, prompt_index=lease.prompt_index,
        behavior_version=lease.version if version is None else version,
        prompt_ids=np.array([1], np.int32), completion_ids=np.ones(int(lens.sum()), np.int32),
        completion_lens=lens, behavior_logp=np.full(int(lens.sum()), -0.5, np.float32),
        token_versions=np.zeros(0, np.int32), rewards=np.array(rewards, np.float32),
        finish_reasons=("stop",) * len(rewards), temperature=1.0, evaluation=True,
    )  # fmt: skip


def test_rounds_begin_at_version_0_and_each_multiple_crossed():
    b, _ = book(every=5)
    assert b.due(0)
    b.schedule(0, now=0.0)
    assert [v for v in range(1, 16) if b.due(v)] == [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    b.schedule(7, now=0.0)  # publish_every or a superseded snapshot skipped 5 and 6
    assert [v for v in range(8, 16) if b.due(v)] == [10, 11, 12, 13, 14, 15]


def test_eval_leases_go_only_to_a_producer_holding_the_version():
    b, _ = book()
    b.schedule(5, now=0.0)
    assert b.leasing() == (-1, 5)  # no version until a producer holding v5 or newer asks
    assert b.grant("p", 4, 8, now=0.0) == []  # holds an older version
    leases = b.grant("p", 5, 2, now=0.0)
    assert [(x.version, x.prompt_index) for x in leases] == [(5, 0), (5, 1)]
    assert all(x.lease_id & EVAL_BIT for x in leases)
    assert b.leasing_version() == 5
    assert b.grant("q", 6, 8, now=0.0) == []  # a newer one: the round is v5's
    assert b.balance()


def test_a_round_whose_version_every_producer_skipped_evaluates_the_next_and_says_so():
    b, _ = book(num_prompts=1)
    b.schedule(5, now=0.0)
    (lease,) = b.grant("p", 7, 8, now=0.0)  # producers went from v4 straight to v7
    assert lease.version == 7
    b.receive(answer(lease, [1.0, 0.0]))
    assert b.take_result()["eval_version"] == 7
    assert b.totals()["eval_rounds_retargeted"] == 1


def test_a_whole_round_reports_mean_reward_pass_at_1_and_pass_at_k():
    b, acks = book()
    b.schedule(5, now=0.0)
    leases = b.grant("p", 5, 8, now=0.0)
    rewards = [[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]]
    for lease, r in zip(leases, rewards, strict=True):
        assert b.receive(answer(lease, r)) == "accept"
    result = b.take_result()
    assert result is not None
    assert result["eval_version"] == 5
    assert result["eval_reward_mean"] == pytest.approx(0.5)
    assert result["eval_pass_at_1"] == pytest.approx((0.5 + 0 + 1) / 3)
    expected_k = (pass_at_k(2, 1, K) + pass_at_k(2, 0, K) + pass_at_k(2, 2, K)) / 3
    assert result["eval_pass_at_k"] == pytest.approx(expected_k)
    assert result["eval_completion_len_mean"] == 3
    assert (result["eval_prompts"], result["eval_k"]) == (3, K)
    assert [a.outcome for _, a in acks] == [wire.EVALUATED] * 3
    assert b.take_result() is None
    assert b.balance()
    assert not b.rounds


def test_a_declined_or_expired_lease_goes_back_to_its_round_and_is_counted():
    b, _ = book(num_prompts=2)
    b.schedule(5, now=0.0)
    first, _second = b.grant("p", 5, 2, now=0.0)
    b.decline("p", (first.lease_id,))
    assert b.expire(now=100.0, lease_timeout_s=10.0, gone=set()) == 1  # second, overdue
    again = b.grant("q", 5, 8, now=100.0)
    assert sorted(x.prompt_index for x in again) == [0, 1]
    for lease in again:
        b.receive(answer(lease, [1.0, 1.0], producer="q"))
    assert b.take_result() is not None
    totals = b.totals()
    assert (totals["eval_leases_declined"], totals["eval_leases_expired"]) == (1, 1)
    assert totals["eval_leases_issued"] == 4
    assert b.balance()


def test_a_round_nobody_can_sample_any_more_is_skipped_and_counted_never_reported():
    b, _ = book(num_prompts=3)
    b.schedule(5, now=0.0)
    (lease,) = b.grant("p", 5, 1, now=0.0)
    b.close_unreachable({5}, published=6)  # someone still holds 5: nothing happens
    assert b.rounds[5].queue
    b.close_unreachable({6}, published=6)
    b.receive(answer(lease, [1.0, 1.0]))  # the lease out still counts
    assert b.take_result() is None
    totals = b.totals()
    assert (totals["eval_prompts_skipped"], totals["eval_rounds_skipped"]) == (2, 1)
    assert b.balance()
    assert not b.rounds


def test_a_newer_round_closes_the_older_one():
    b, _ = book(num_prompts=2)
    b.schedule(0, now=0.0)
    b.schedule(5, now=0.0)
    assert b.totals()["eval_rounds_skipped"] == 1
    assert b.grant("p", 0, 8, now=0.0) == []
    assert len(b.grant("p", 5, 8, now=0.0)) == 2


def test_groups_of_another_version_producer_or_no_open_lease_are_refused():
    b, acks = book(num_prompts=1)
    b.schedule(5, now=0.0)
    (lease,) = b.grant("p", 5, 1, now=0.0)
    assert b.receive(answer(lease, [1.0, 1.0], producer="q")) == "wrong_producer"
    assert b.receive(answer(lease, [1.0, 1.0], version=6)) == "wrong_version"
    assert acks[-1][1] == wire.Ack(lease.lease_id, "expired")
    assert b.receive(answer(lease, [1.0, 1.0])) == "late"
    (again,) = b.grant("p", 5, 1, now=0.0)
    b.receive(answer(again, [0.0, 0.0]))
    assert b.take_result()["eval_pass_at_k"] == 0.0


def test_a_producer_that_re_registers_without_its_eval_lease_loses_it():
    b, _ = book(num_prompts=2)
    b.schedule(5, now=0.0)
    kept, _lost = b.grant("p", 5, 2, now=0.0)
    b.reconcile("p", {kept.lease_id})
    assert set(b.open) == {kept.lease_id}
    assert b.totals()["eval_leases_expired"] == 1
    b.expire_all()
    assert b.balance()
    assert not b.open
    assert not b.rounds
    assert b.totals()["eval_rounds_skipped"] == 1


def test_a_round_whose_leases_all_came_back_unsampled_takes_the_next_version_held():
    b, _ = book(num_prompts=2)
    b.schedule(5, now=0.0)
    leases = b.grant("p", 5, 8, now=0.0)  # a request answered late: p has moved on
    b.decline("p", tuple(x.lease_id for x in leases))
    b.close_unreachable({7}, published=7)
    assert b.leasing_version() == -1  # no version: nothing was sampled with v5
    again = b.grant("p", 7, 8, now=0.0)
    for lease in again:
        b.receive(answer(lease, [1.0, 1.0]))
    assert b.take_result()["eval_version"] == 7
    assert b.totals()["eval_rounds_retargeted"] == 1
    assert b.totals()["eval_rounds_skipped"] == 0


def test_the_runs_last_version_is_evaluated_and_its_result_taken_last(caplog):
    caplog.set_level("INFO", logger="asyncgrpo.consumer")
    b = EvalBook(
        1, every_steps=5, samples=K, pass_reward=1.0, ack=lambda p, a: None, last_version=8
    )
    b.schedule(0, now=0.0)
    b.schedule(5, now=0.0)
    assert [v for v in range(6, 9) if b.due(v)] == [8]  # not a multiple of 5: the last version
    assert not b.ended(8)  # not begun yet: the learner waits for it to begin and end
    (old,) = b.grant("p", 5, 8, now=0.0)
    b.receive(answer(old, [1.0, 0.0]))  # v5's result, not taken by a step yet
    b.schedule(8, now=0.0)
    assert not b.ended(8)
    (lease,) = b.grant("p", 8, 8, now=0.0)
    b.receive(answer(lease, [1.0, 1.0]))
    assert b.ended(8)
    assert b.take_result(newest=True)["eval_version"] == 8  # the run's last line: the last one
    assert "'eval_version': 5" in caplog.text  # the older one said, not dropped silently
    assert b.take_result() is None
    plain = EvalBook(1, every_steps=5, samples=K, pass_reward=1.0, ack=lambda p, a: None)
    plain.schedule(5, now=0.0)
    assert not plain.due(8)  # without a last version: only multiples

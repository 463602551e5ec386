"""The lease state machine and ledger of consumer/server/leases.py (pure: `now` is an argument)."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ledger_invariant import assert_book_balanced

from common.wire import OUTCOMES, Ack
from consumer.data.prompts import PromptOrder
from consumer.server.leases import FinalStates, LeaseBook

P = 4  # prompts per step


def make_book(
    *, max_staleness: int = 0, prompts_per_step: int = P, num_prompts: int = 100, **kw
) -> LeaseBook:
    order = PromptOrder(num_prompts, seed=0, shuffle=False, epochs=kw.pop("epochs", 0))
    return LeaseBook(order, prompts_per_step=prompts_per_step, max_staleness=max_staleness, **kw)


def grant(book: LeaseBook, n: int = 100, *, version: int = 0, published: int | None = None,
          producer: str = "a", now: float = 0.0):  # fmt: skip
    published = version if published is None else published
    return book.grant(producer, n, policy_version=version, published_version=published, now=now)


def deliver(book: LeaseBook, rec, outcome: str = "trained") -> None:
    assert book.receive(rec.lease_id, rec.producer_id) == "accept"
    book.finalize(rec.lease_id, outcome)


# ---------------------------------------------------------------------------------------------
# Granting keeps the staleness bound by construction


def test_synchronous_mode_grants_exactly_one_step_of_leases():
    book = make_book(max_staleness=0)
    first = grant(book)
    assert len(first) == P
    assert {(r.step, r.min_version) for r in first} == {(0, 0)}
    assert grant(book) == []
    for rec in first:  # the learner trains them and takes its step in one go
        deliver(book, rec)
    second = grant(book, version=1)
    assert len(second) == P
    assert {(r.step, r.min_version) for r in second} == {(1, 1)}


@pytest.mark.parametrize("k", [0, 1, 2, 5])
def test_max_staleness_k_allows_k_plus_one_steps_of_open_leases(k):
    book = make_book(max_staleness=k)
    leases = grant(book, 1000, version=10)
    assert len(leases) == (k + 1) * P
    assert [r.step for r in leases] == [10 + i // P for i in range(len(leases))]
    assert all(r.min_version == r.step - k for r in leases)
    assert grant(book, version=10) == []


def test_a_dropped_group_frees_its_place_for_the_same_step():
    book = make_book(max_staleness=0)
    leases = grant(book)
    deliver(book, leases[0], "dropped_zero_variance")
    again = grant(book)
    assert len(again) == 1
    assert again[0].step == 0


@pytest.mark.parametrize(
    ("k", "version", "published", "expected"),
    [
        (1, 5, 2, 0),  # step 5 needs weights >= 4, only 2 are out
        (1, 5, 4, P),  # step 5 may start on 4; step 6 would need 5
        (1, 5, 5, 2 * P),
        (2, 3, 1, P),  # min_version = 1 for step 3, then 2 for step 4 > published 1
        (0, 3, 2, 0),
        (0, 0, 0, P),
    ],
)
def test_no_lease_whose_min_version_exceeds_the_published_version(k, version, published, expected):
    book = make_book(max_staleness=k)
    leases = grant(book, 1000, version=version, published=published)
    assert len(leases) == expected
    assert all(r.min_version <= published for r in leases)


def test_grant_stops_when_prompts_run_out():
    book = make_book(max_staleness=3, num_prompts=3, epochs=1)
    assert [r.prompt_index for r in grant(book)] == [0, 1, 2]
    assert grant(book) == []


def test_grant_respects_max_leases():
    book = make_book(max_staleness=3)
    assert len(grant(book, 3)) == 3
    assert len(grant(book, 0)) == 0


def test_a_fresh_book_is_incarnation_zero_and_its_first_lease_id_is_zero():
    book = make_book()
    assert book.incarnation == 0
    assert [r.lease_id for r in grant(book, 2)] == [0, 1]


def test_lease_ids_carry_the_incarnation_and_are_unique():
    book = make_book(max_staleness=5, incarnation=3)
    ids = [r.lease_id for r in grant(book)]
    assert len(set(ids)) == len(ids)
    assert all(i >> 40 == 3 for i in ids)
    assert [i & ((1 << 40) - 1) for i in ids] == list(range(len(ids)))


# ---------------------------------------------------------------------------------------------
# Delivery: accept, duplicate, late, unknown


def test_a_duplicate_before_finalize_is_refused_and_not_acked():
    book = make_book()
    (rec,) = grant(book, 1)
    assert book.receive(rec.lease_id, "a") == "accept"
    assert book.receive(rec.lease_id, "a") == "duplicate"
    assert book.take_acks("a") == ()


def test_a_finalized_lease_is_acked_once_and_a_redelivery_is_a_duplicate_acked_again():
    book = make_book()
    (rec,) = grant(book, 1)
    deliver(book, rec)
    assert book.take_acks("a") == (Ack(rec.lease_id, "trained"),)
    assert book.take_acks("a") == ()
    assert book.receive(rec.lease_id, "a") == "duplicate"
    assert book.take_acks("a") == (Ack(rec.lease_id, "trained"),)
    assert book.balance().trained == 1


def test_a_group_for_an_expired_lease_is_late_and_acked_as_expired():
    book = make_book()
    (rec,) = grant(book, 1)
    assert book.expire(now=0.0, lease_timeout_s=10.0, gone={"a"}) != []
    assert book.take_acks("a") == ()  # nothing was delivered: nothing to acknowledge yet
    assert book.receive(rec.lease_id, "a") == "late"
    assert book.take_acks("a") == (Ack(rec.lease_id, "expired"),)
    assert book.balance().expired == 1


def test_a_group_for_an_unknown_lease_is_acked_as_expired():
    book = make_book()
    assert book.receive(12345, "x") == "unknown"
    assert book.take_acks("x") == (Ack(12345, "expired"),)


def test_acks_queue_per_producer():
    book = make_book(max_staleness=1)
    (a,) = grant(book, 1, producer="a")
    (b,) = grant(book, 1, producer="b")
    deliver(book, a)
    deliver(book, b, "dropped_zero_variance")
    assert book.take_acks("b") == (Ack(b.lease_id, "dropped_zero_variance"),)
    assert book.take_acks("a") == (Ack(a.lease_id, "trained"),)


def test_a_group_for_another_producers_open_lease_is_refused_and_the_lease_stays_its_holders():
    book = make_book()
    (rec,) = grant(book, 1, producer="a")
    assert book.receive(rec.lease_id, "b") == "wrong_producer"
    assert book.open[rec.lease_id].state == "issued"
    assert book.take_acks("b") == ()  # the forger learns nothing and is credited nothing
    assert book.receive(rec.lease_id, "a") == "accept"  # the holder still delivers
    assert book.receive(rec.lease_id, "b") == "wrong_producer"  # also once it is received
    book.finalize(rec.lease_id, "trained")
    assert {p: dict(c) for p, c in book.by_producer.items()} == {"a": {"issued": 1, "trained": 1}}
    assert book.take_acks("a") == (Ack(rec.lease_id, "trained"),)
    assert_book_balanced(book)


def test_acks_are_bounded_per_producer_and_leave_in_replies_of_bounded_size():
    from common.wire import ACKS_PER_REPLY
    from consumer.server.leases import MAX_ACKS

    book = make_book()
    for lease_id in range(MAX_ACKS + 5):  # unknown leases: each is acked as expired
        assert book.receive(1_000_000 + lease_id, "x") == "unknown"
    assert book.acks_dropped == 5
    first = book.take_acks("x")
    assert len(first) == ACKS_PER_REPLY
    assert first[0].lease_id == 1_000_005  # the oldest went first
    taken = len(first)
    while chunk := book.take_acks("x"):
        taken += len(chunk)
    assert taken == MAX_ACKS
    assert "x" not in book.acks
    book.receive(7_000_000, "y")
    book.forget_acks("y")
    assert book.take_acks("y") == ()


def test_a_group_delivered_by_its_own_producer_moves_nothing():
    book = make_book()
    (rec,) = grant(book, 1, producer="a")
    assert book.receive(rec.lease_id, "a") == "accept"
    book.finalize(rec.lease_id, "trained")
    assert {p: dict(c) for p, c in book.by_producer.items()} == {"a": {"issued": 1, "trained": 1}}


@pytest.mark.parametrize(
    ("producer", "key", "delta"),
    [("a", "issued", -1), ("a", "issued", 1), ("a", "trained", 1), ("b", "expired", -1),
     ("b", "issued", 1), ("a", "handed_over", 1), ("b", "taken_over", 1)],
)  # fmt: skip
def test_balance_is_not_ok_when_one_producers_counts_are_off(producer, key, delta):
    book = make_book(max_staleness=1)
    a = grant(book, 2, producer="a")
    b = grant(book, 2, producer="b")
    deliver(book, a[0])
    book.finalize(b[0].lease_id, "expired")
    assert book.balance().ok
    book.by_producer[producer][key] += delta
    other = "b" if producer == "a" else "a"
    book.by_producer[other][key] -= delta  # the totals still agree: only per producer is off
    assert not book.balance().ok


def test_per_producer_counts_follow_the_grants_and_outcomes():
    book = make_book(max_staleness=2)
    a = grant(book, 5, producer="a")
    b = grant(book, 3, producer="b")
    deliver(book, a[0])
    deliver(book, a[1], "dropped_stale")
    deliver(book, b[0], "dropped_zero_variance")
    book.finalize(b[1].lease_id, "rejected_invalid")
    book.expire(now=1.0, lease_timeout_s=10.0, gone={"a"})
    assert {p: dict(c) for p, c in book.by_producer.items()} == {
        "a": {"issued": 5, "trained": 1, "dropped_stale": 1, "expired": 3},
        "b": {"issued": 3, "dropped_zero_variance": 1, "rejected_invalid": 1},
    }
    assert_book_balanced(book)
    assert book.balance().open == 1


def test_a_lease_cannot_be_finalized_twice():
    book = make_book()
    (rec,) = grant(book, 1)
    deliver(book, rec)
    with pytest.raises(KeyError):
        book.finalize(rec.lease_id, "dropped_stale")
    assert book.balance().trained == 1
    assert book.balance().dropped_stale == 0


def test_a_rejected_group_ends_its_issued_lease_and_is_acked():
    book = make_book()
    (rec,) = grant(book, 1)
    book.finalize(rec.lease_id, "rejected_invalid", reason="bad_logprob")
    assert book.take_acks("a") == (Ack(rec.lease_id, "rejected_invalid"),)
    assert book.receive(rec.lease_id, "a") == "duplicate"


# ---------------------------------------------------------------------------------------------
# Retries


@pytest.mark.parametrize("outcome", ["expired", "dropped_stale"])
def test_the_prompt_of_an_expired_or_stale_lease_is_leased_again_before_new_ones(outcome):
    book = make_book(max_staleness=1)
    leases = grant(book, 3)
    assert [r.prompt_index for r in leases] == [0, 1, 2]
    if outcome == "expired":
        book.reconcile("a", held={leases[0].lease_id, leases[2].lease_id})
    else:
        deliver(book, leases[1], "dropped_stale")
    again = grant(book, 2)
    assert [r.prompt_index for r in again] == [1, 3]
    assert again[0].lease_id != leases[1].lease_id


@pytest.mark.parametrize("outcome", ["rejected_invalid", "trained", "dropped_zero_variance"])
def test_the_prompt_of_a_rejected_trained_or_zero_variance_lease_is_not_retried(outcome):
    book = make_book(max_staleness=1)
    leases = grant(book, 2)
    if outcome == "rejected_invalid":
        book.finalize(leases[0].lease_id, outcome)
    else:
        deliver(book, leases[0], outcome)
    assert [r.prompt_index for r in grant(book, 1)] == [2]


# ---------------------------------------------------------------------------------------------
# Expiry and reconciliation


def test_expire_ends_only_overdue_or_orphaned_leases_not_yet_delivered():
    book = make_book(max_staleness=3)
    old = grant(book, 2, producer="a", now=0.0)
    fresh = grant(book, 1, producer="a", now=50.0)
    orphan = grant(book, 1, producer="gone", now=50.0)
    delivered_old = grant(book, 1, producer="a", now=0.0)
    assert book.receive(delivered_old[0].lease_id, "a") == "accept"
    expired = book.expire(now=60.0, lease_timeout_s=30.0, gone={"gone"})
    assert {r.lease_id for r in expired} == {r.lease_id for r in old + orphan}
    assert all(r.state == "expired" for r in expired)
    assert {r.reason for r in expired} == {"timeout"}
    assert set(book.open) == {fresh[0].lease_id, delivered_old[0].lease_id}


def test_a_lease_exactly_as_old_as_the_timeout_is_not_yet_expired():
    book = make_book()
    (rec,) = grant(book, 1, now=10.0)
    assert book.expire(now=40.0, lease_timeout_s=30.0, gone=set()) == []
    assert [r.lease_id for r in book.expire(now=40.5, lease_timeout_s=30.0, gone=set())] == [
        rec.lease_id
    ]


def test_reconcile_expires_only_that_producers_undelivered_leases_it_no_longer_holds():
    book = make_book(max_staleness=3)
    lost, held, received = grant(book, 3, producer="a")
    other = grant(book, 1, producer="b")[0]
    assert book.receive(received.lease_id, "a") == "accept"
    expired = book.reconcile("a", held={held.lease_id})
    assert [r.lease_id for r in expired] == [lost.lease_id]
    assert [r.reason for r in expired] == ["not held"]
    assert set(book.open) == {held.lease_id, received.lease_id, other.lease_id}
    assert book.reconcile("a", held={held.lease_id}) == []


def test_expire_all_ends_every_open_lease_and_requeues_its_prompt():
    book = make_book(max_staleness=1)
    leases = grant(book)
    assert book.receive(leases[0].lease_id, "a") == "accept"
    book.expire_all("shutdown")
    assert {r.reason for r in book.take_finished()} == {"shutdown"}
    assert book.open == {}
    assert book.balance().to_json() == {"issued": len(leases), "trained": 0, "dropped_stale": 0,
                                        "dropped_zero_variance": 0, "rejected_invalid": 0,
                                        "expired": len(leases), "open": 0, "ok": 1}  # fmt: skip
    assert [r.prompt_index for r in grant(book, len(leases))] == [r.prompt_index for r in leases]


def test_take_finished_returns_each_final_record_once():
    book = make_book()
    leases = grant(book, 2)
    deliver(book, leases[0])
    book.finalize(leases[1].lease_id, "expired", reason="timeout")
    rows = book.take_finished()
    assert [(r.lease_id, r.state) for r in rows] == [
        (leases[0].lease_id, "trained"),
        (leases[1].lease_id, "expired"),
    ]
    assert rows[1].reason == "timeout"
    assert book.take_finished() == []


def test_a_record_never_trained_carries_trained_step_minus_one():
    book = make_book(max_staleness=1)
    trained, stale, expired, rejected = grant(book, 4, now=2.5)
    assert book.receive(trained.lease_id, "a") == "accept"
    book.finalize(trained.lease_id, "trained", trained_step=3, behavior_version=2, num_tokens=9)
    assert book.receive(stale.lease_id, "a") == "accept"
    book.finalize(stale.lease_id, "dropped_stale", behavior_version=0, num_tokens=5)
    book.finalize(expired.lease_id, "expired", reason="timeout")
    book.finalize(rejected.lease_id, "rejected_invalid", reason="bad_logprob")
    rows = {r.state: r for r in book.take_finished()}
    assert list(rows["trained"].to_json().items()) == [  # a line of leases.jsonl, key order too
        ("lease_id", trained.lease_id), ("prompt_index", trained.prompt_index), ("step", 0),
        ("min_version", 0), ("producer_id", "a"), ("issued_at", 2.5), ("state", "trained"),
        ("behavior_version", 2), ("trained_step", 3), ("num_tokens", 9), ("reason", ""),
    ]  # fmt: skip
    for state in ("dropped_stale", "expired", "rejected_invalid"):
        assert rows[state].trained_step == -1, state
    stale, expired = rows["dropped_stale"], rows["expired"]
    assert (stale.behavior_version, stale.num_tokens) == (0, 5)
    assert (expired.behavior_version, expired.num_tokens) == (-1, 0)
    assert (rows["expired"].reason, rows["rejected_invalid"].reason) == (
        "timeout",
        "bad_logprob",
    )


# ---------------------------------------------------------------------------------------------
# Random operation sequences keep the ledger balanced


OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["grant", "receive", "finalize", "reject", "expire", "reconcile", "advance", "publish"]
        ),
        st.integers(0, 2),  # which producer
        st.integers(0, 1 << 16),  # which lease / how many / which outcome
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, k=st.integers(0, 2), ppstep=st.integers(1, 3))
def test_random_operations_keep_the_balance_and_never_finalize_twice(ops, k, ppstep):
    book = make_book(max_staleness=k, prompts_per_step=ppstep, num_prompts=7)
    producers = ["a", "b", "c"]
    version = published = 0
    now = 0.0
    issued: list[int] = []
    issued_by: Counter[str] = Counter()
    finalized: list[int] = []
    for op, p, n in ops:
        producer = producers[p]
        now += 1.0
        open_ids = sorted(book.open)
        if op == "grant":
            got = book.grant(
                producer, n % 5, policy_version=version, published_version=published, now=now
            )
            issued += [r.lease_id for r in got]
            issued_by[producer] += len(got)
            assert all(r.min_version <= min(version, published) for r in got)
        elif op == "receive" and issued:
            lease_id = issued[n % len(issued)] if n % 7 else 999_999
            rec = book.open.get(lease_id)
            state = rec.state if rec is not None else None
            verdict = book.receive(lease_id, producer)
            if state is not None and rec.producer_id != producer:
                assert verdict == "wrong_producer"
                assert rec.state == state  # untouched: its holder may still deliver it
            elif state == "issued":
                assert verdict == "accept"
            elif state == "received":
                assert verdict == "duplicate"
            else:
                assert verdict in ("duplicate", "late", "unknown")
                assert book.acks[producer][-1].lease_id == lease_id
        elif op == "finalize":
            received = [i for i in open_ids if book.open[i].state == "received"]
            if received:
                outcome = ("trained", "dropped_stale", "dropped_zero_variance")[n % 3]
                book.finalize(received[n % len(received)], outcome)
                finalized.append(received[n % len(received)])
        elif op == "reject":
            fresh = [i for i in open_ids if book.open[i].state == "issued"]
            if fresh:
                book.finalize(fresh[n % len(fresh)], "rejected_invalid")
                finalized.append(fresh[n % len(fresh)])
        elif op == "expire":
            gone = {producer} if n % 2 else set()
            finalized += [r.lease_id for r in book.expire(now=now, lease_timeout_s=5.0, gone=gone)]
        elif op == "reconcile":
            mine = [i for i in open_ids if book.open[i].producer_id == producer]
            held = {i for j, i in enumerate(mine) if (n >> j) & 1}
            finalized += [r.lease_id for r in book.reconcile(producer, held)]
        elif op == "advance":
            version += 1
        elif op == "publish":
            published = version
        if n % 4 == 0:
            book.take_acks(producers[n % 3])

        balance = book.balance()
        assert balance.ok
        assert balance.issued == len(issued)
        assert len(finalized) == len(set(finalized))  # never finalized twice
        assert set(book.open).isdisjoint(book.final_states)
        assert set(book.open) | set(book.final_states) == set(issued)
        assert sum(balance.final(o) for o in OUTCOMES) == len(book.final_states)
        assert len(book.open) <= (k + 1) * ppstep
        assert {p: c["issued"] for p, c in book.by_producer.items() if c["issued"]} == +issued_by
        assert_book_balanced(book)


# ---------------------------------------------------------------------------------------------
# Checkpoint and resume


def busy_book() -> tuple[LeaseBook, dict[str, object]]:
    """A book with issued, received and final leases of several kinds, and its saved state."""
    book = make_book(max_staleness=2, incarnation=1)
    leases = grant(book, producer="a")
    assert book.receive(leases[0].lease_id, "a") == "accept"  # delivered, not trained yet
    deliver(book, leases[1])
    deliver(book, leases[2], "dropped_stale")  # prompt 2 waits for retry
    book.finalize(leases[3].lease_id, "expired")  # prompt 3 waits for retry
    book.finalize(leases[4].lease_id, "rejected_invalid")
    return book, json.loads(json.dumps(book.state_dict()))  # saved as JSON in a checkpoint


def test_resume_restores_the_ledger_as_the_next_incarnation():
    book, state = busy_book()
    restored = make_book(max_staleness=2)
    restored.load_state_dict(state, now=500.0)
    assert restored.incarnation == book.incarnation + 1
    assert restored.balance() == book.balance()
    assert restored.balance().ok
    assert restored.final_states == book.final_states
    assert {p: dict(c) for p, c in restored.by_producer.items()} == {
        p: dict(c) for p, c in book.by_producer.items()
    }
    assert set(restored.open) == set(book.open)
    # pinned, not only equal to the saving side (which could share a bug)
    assert dict(restored.by_producer["a"]) == {
        "issued": 12, "trained": 1, "dropped_stale": 1, "expired": 1, "rejected_invalid": 1,
    }  # fmt: skip
    assert_book_balanced(book)
    assert_book_balanced(restored)


def test_a_resumed_book_keeps_balancing_as_it_goes_on():
    _, state = busy_book()
    restored = make_book(max_staleness=2)
    restored.load_state_dict(state, now=0.0)
    for rec in list(restored.open.values())[:4]:
        assert restored.receive(rec.lease_id, "b") == "wrong_producer"  # not b's lease
        assert restored.receive(rec.lease_id, "a") == "accept"  # re-sent by its holder
        restored.finalize(rec.lease_id, "trained")
    restored.expire(now=1.0, lease_timeout_s=0.5, gone=set())
    grant(restored, 3, producer="c")
    assert restored.by_producer["c"]["issued"] == 3
    assert restored.by_producer["a"]["trained"] == 1 + 4
    assert "b" not in restored.by_producer
    assert_book_balanced(restored)


def test_a_checkpoint_whose_leases_moved_between_producers_still_balances():
    """Leases once moved to the producer that delivered them (handed_over / taken_over)."""
    book, _ = busy_book()
    state = json.loads(json.dumps(book.state_dict()))
    state["by_producer"]["a"]["handed_over"] = 1
    state["by_producer"]["a"]["trained"] -= 1
    state["by_producer"]["b"] = {"taken_over": 1, "trained": 1}
    restored = make_book(max_staleness=2)
    restored.load_state_dict(state, now=0.0)
    assert restored.balance().ok
    assert_book_balanced(restored)


def test_resume_turns_received_leases_back_into_issued_ones():
    book, state = busy_book()
    restored = make_book(max_staleness=2)
    restored.load_state_dict(state, now=500.0)
    assert {r.state for r in restored.open.values()} == {"issued"}
    assert {r.issued_at for r in restored.open.values()} == {500.0}
    received = next(i for i, r in book.open.items() if r.state == "received")
    assert restored.receive(received, "a") == "accept"  # the producer re-sends it


def test_resume_never_reuses_a_lease_id_issued_before_the_restart():
    book, state = busy_book()
    before = set(book.open) | set(book.final_states)
    after_save = {r.lease_id for r in grant(book, producer="a")}  # issued, then the crash
    restored = make_book(max_staleness=2)
    restored.load_state_dict(state, now=0.0)
    for rec in list(restored.open.values()):
        restored.finalize(rec.lease_id, "expired")
    new = [r.lease_id for r in grant(restored, producer="b")]
    assert new
    assert set(new).isdisjoint(before | after_save)
    assert new == [(book.incarnation + 1) << 40 | n for n in range(len(new))]  # n from 0 again


def test_resume_continues_with_the_same_prompts_retries_first():
    book, state = busy_book()
    for rec in list(book.open.values()):
        book.finalize(rec.lease_id, "expired")
    restored = make_book(max_staleness=2)
    restored.load_state_dict(state, now=0.0)
    for rec in list(restored.open.values()):
        restored.finalize(rec.lease_id, "expired")
    expected = [r.prompt_index for r in grant(book, producer="a")]
    assert [r.prompt_index for r in grant(restored, producer="a")] == expected
    assert expected[:2] == [2, 3]  # the stale and the expired prompt come back first


def test_late_groups_from_before_the_restart_are_classified_by_the_saved_ledger():
    book, state = busy_book()
    restored = make_book(max_staleness=2)
    restored.load_state_dict(state, now=0.0)
    verdicts = {book.final_states[i]: restored.receive(i, "a") for i in book.final_states}
    assert verdicts == {
        "trained": "duplicate",
        "dropped_stale": "duplicate",
        "expired": "late",
        "rejected_invalid": "duplicate",
    }


# -- final outcomes: compact, and the same answers as a dict ---------------------------------------
@settings(max_examples=50, deadline=None)
@given(
    st.dictionaries(
        st.tuples(st.integers(0, 3), st.integers(0, 5000)).map(lambda t: t[0] << 40 | t[1]),
        st.sampled_from(OUTCOMES),
        max_size=200,
    )
)
def test_final_states_answer_like_the_dict_they_replace(reference: dict[int, str]):
    states = FinalStates()
    for lease_id, outcome in reference.items():
        states[lease_id] = outcome
    assert len(states) == len(reference)
    assert sorted(states) == sorted(reference)
    assert dict(states.items()) == reference
    for probe in [*reference, 0, 1 << 40, (3 << 40) | 4999, (7 << 40) | 1]:
        assert states.get(probe) == reference.get(probe)
        assert (probe in states) == (probe in reference)
    restored = FinalStates.from_state_dict(json.loads(json.dumps(states.state_dict())))
    assert restored == states
    assert len(restored) == len(states)


def test_final_states_take_one_byte_per_lease_in_a_checkpoint():
    states = FinalStates()
    for n in range(100_000):
        states[(2 << 40) | n] = OUTCOMES[n % len(OUTCOMES)]
    saved = json.dumps(states.state_dict())
    assert len(saved) < 140_000  # base64: 4/3 byte per lease (a dict took about 25)
    assert FinalStates.from_state_dict(json.loads(saved)) == states


def test_final_states_take_under_two_bytes_per_lease_in_memory():
    import tracemalloc

    tracemalloc.start()
    try:
        states = FinalStates()
        for n in range(100_000):  # in order, as a book ends them: growth is amortised
            states[(1 << 40) | n] = "trained"
        size, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size < 200_000
    assert len(states) == 100_000


def test_final_states_read_checkpoints_written_as_a_dict():
    old = {str((1 << 40) | 7): "trained", str(3): "expired"}
    states = FinalStates.from_state_dict(old)
    assert dict(states.items()) == {(1 << 40) | 7: "trained", 3: "expired"}


def test_final_states_of_a_lease_never_ended_raise_key_error():
    states = FinalStates()
    states[(1 << 40) | 2] = "trained"
    assert states[(1 << 40) | 2] == "trained"
    for missing in [(1 << 40) | 0, (1 << 40) | 1, (1 << 40) | 3, (1 << 40) | 99, 2, (5 << 40) | 2]:
        with pytest.raises(KeyError) as info:
            states[missing]
        assert info.value.args == (missing,)
        assert states.get(missing) is None
        assert missing not in states
    assert "trained" not in states  # only lease ids are members
    assert len(states) == 1


def test_a_corrupt_outcome_code_is_refused():
    import base64

    with pytest.raises(ValueError, match="unknown lease outcome"):
        FinalStates.from_state_dict({"0": base64.b64encode(bytes([1, 99])).decode()})

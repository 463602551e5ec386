"""common/host/core_board.py: the cores of one host shared by the processes of one run, by who has
work now (the split, the records on disk, dead members, the seat's busy time and weight, a
recording's threads)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.host import core_board as CB


def member(
    name: str, *, busy: bool = True, weight: float = 1.0, fixed: int = 0, most: int = 1 << 10
) -> CB.Member:
    return CB.Member(name, os.getpid(), busy, weight, fixed, most)


def test_whoever_has_work_takes_the_cores_the_idle_leave():
    learner, producer = member("learner"), member("p1")
    assert CB.shares(2, [learner, producer]) == {"learner": 1, "p1": 1}
    assert CB.shares(2, [learner, member("p1", busy=False)]) == {"learner": 2}
    assert CB.shares(2, [member("learner", busy=False), producer]) == {"p1": 2}
    assert CB.shares(2, [member("learner", busy=False), member("p1", busy=False)]) == {}


def test_busy_members_split_in_proportion_to_their_work_per_step():
    got = CB.shares(16, [member("learner", weight=3.0), member("p1"), member("p2")])
    assert got == {"learner": 10, "p1": 3, "p2": 3}
    assert CB.shares(4, [member("learner", weight=10.0), member("p1")]) == {"learner": 3, "p1": 1}


def test_more_busy_members_than_cores_run_one_thread_each():
    got = CB.shares(2, [member("learner"), member("p1"), member("p2")])
    assert got == {"learner": 1, "p1": 1, "p2": 1}


def test_fixed_threads_are_kept_and_the_others_share_what_is_left():
    got = CB.shares(8, [member("learner", fixed=5), member("p1"), member("p2")])
    assert got == {"learner": 5, "p1": 2, "p2": 1}  # equal weights: ties to the first name
    assert CB.shares(2, [member("learner", fixed=4), member("p1")]) == {"learner": 4, "p1": 1}


def test_threads_that_would_not_help_a_member_go_to_the_others():
    got = CB.shares(8, [member("learner", weight=9.0, most=2), member("p1")])
    assert got == {"learner": 2, "p1": 6}


@given(
    cores=st.integers(1, 64),
    spec=st.lists(
        st.tuples(st.booleans(), st.floats(0.01, 100), st.integers(0, 3), st.integers(1, 64)),
        min_size=1,
        max_size=8,
    ),
)
def test_no_more_threads_than_cores_unless_each_busy_sharer_has_one(cores, spec):
    members = [
        member(f"m{i}", busy=b, weight=w, fixed=f, most=m) for i, (b, w, f, m) in enumerate(spec)
    ]
    got = CB.shares(cores, members)
    busy = [m for m in members if m.busy]
    assert set(got) == {m.name for m in busy}
    sharers = [m for m in busy if not m.fixed]
    assert all(got[m.name] >= 1 for m in sharers)
    assert all(got[m.name] == m.fixed for m in busy if m.fixed)
    assert all(got[m.name] <= m.max_threads for m in sharers)
    fixed = sum(m.fixed for m in busy)
    assert sum(got[m.name] for m in sharers) <= max(cores - fixed, len(sharers))
    # nothing left idle that a sharer could still use
    if sum(got.values()) < cores:
        assert all(got[m.name] == m.max_threads for m in sharers)
    assert CB.shares(cores, list(reversed(members))) == got  # the same from every member


def test_members_see_each_other_through_the_board_directory(tmp_path):
    learner = CB.CoreBoard(tmp_path, "learner", weight=1.0, cores=2, refresh_s=0)
    producer = CB.CoreBoard(tmp_path, "p1", weight=1.0, cores=2, refresh_s=0)
    assert producer.threads() == 2  # the learner is idle
    assert learner.threads() == 1  # both busy now
    assert producer.threads() == 1
    learner.update(busy=False)
    assert producer.threads() == 2
    assert "learner idle" in producer.describe()
    learner.close()
    assert [m.name for m in producer.members()] == ["p1"]
    producer.close()
    assert not tmp_path.exists()  # the last one out removes the board


def test_a_dead_members_record_is_left_out(tmp_path):
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    dead = int(child.stdout)
    board = CB.CoreBoard(tmp_path, "learner", weight=1.0, cores=2, refresh_s=0)
    record = {"name": "p1", "pid": dead, "busy": True, "weight": 1.0, "fixed": 0}
    (tmp_path / "p1").write_text(json.dumps(record | {"max_threads": 64}))
    (tmp_path / "garbled").write_text("{not json")
    assert [m.name for m in board.members()] == ["learner"]
    assert board.threads() == 2


def test_a_board_belongs_to_one_run_on_this_host():
    a, b = CB.directory_for("run-a"), CB.directory_for("run/b")
    assert a != b
    assert "/" not in b.name
    assert a.parent == b.parent


def test_a_seat_weighs_its_busy_cpu_seconds_per_unit_of_progress(tmp_path):
    seat = CB.Seat(CB.CoreBoard(tmp_path, "learner", weight=1.0, cores=2, refresh_s=0))
    seat.work()
    end = time.process_time() + 0.05
    while time.process_time() < end:  # busy: burn CPU
        pass
    seat.rest()
    seat.progress(1)
    first = seat.board.me.weight
    assert first >= 0.04
    assert not seat.board.me.busy
    seat.progress(1)  # nothing busy since: no new measurement
    assert seat.board.me.weight == first


def test_a_replay_takes_the_recorded_threads_pass_after_pass():
    recorded = CB.Recorded((2, 1, 2))
    assert [recorded.work() for _ in range(5)] == [2, 1, 2, 2, 2]
    with pytest.raises(AssertionError):
        CB.Recorded(())


def test_a_small_model_gets_one_thread_a_large_one_what_the_board_gives():
    assert CB.useful_threads(100_000) == 1  # the demo model
    assert CB.useful_threads(134_500_000) >= 2  # SmolLM2-135M
    assert "one at most" in CB.small_note(100_000)
    assert CB.small_note(134_500_000) == ""

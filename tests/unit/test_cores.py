"""The cores rule: how launch splits the usable cores between the learner and hf producers."""

from __future__ import annotations

import pytest

from common import config as C
from launch import cli, cores
from launch.cli import run


@pytest.mark.parametrize(
    ("n", "producers", "learner", "threads"),
    [(1, 1, 1, 1), (2, 1, 1, 1), (3, 1, 2, 1), (4, 1, 2, 2), (8, 2, 4, 2), (16, 4, 8, 2)],
)
def test_the_learner_takes_half_and_producers_share_the_rest_two_cores_each(
    n, producers, learner, threads
):
    got = cores.plan(n, max_staleness=2, prompts_per_step=8)
    assert (got.cores, got.producers, got.learner_threads, got.producer_threads) == (
        n, producers, learner, threads,
    )  # fmt: skip
    assert got.max_in_flight * got.producers >= 3 * 8  # every lease the bound allows is held


def test_a_given_producer_count_splits_the_leases_and_the_threads():
    got = cores.plan(8, max_staleness=0, prompts_per_step=8, producers=3)
    assert (got.producers, got.producer_threads, got.max_in_flight) == (3, 1, 3)


def test_launch_keeps_what_the_user_gave_and_says_so(capsys):
    base, given = C.load_given(None, ["producer.max_in_flight=5"], fallback=cli.DEMO_CONFIG)
    cfg, n = run._split_cores(base, given, None)
    line = capsys.readouterr().err
    assert cfg.producer.max_in_flight == 5
    assert "5 leases in flight each (given)" in line
    assert f"cores: {cores.usable_cores()} usable" in line
    assert n == cores.plan(cores.usable_cores(), max_staleness=2, prompts_per_step=8).producers
    _, n = run._split_cores(base, frozenset(), 3)
    assert n == 3
    assert "3 producers (given)" in capsys.readouterr().err


def test_the_demo_configs_own_keys_are_not_given_so_the_cores_rule_sets_them(capsys):
    base, given = C.load_given(None, fallback=cli.DEMO_CONFIG)
    assert base.producer.max_in_flight == 4  # the demo file's value ...
    cfg, _ = run._split_cores(base, given, None)
    rule = cores.plan(cores.usable_cores(), max_staleness=2, prompts_per_step=8)
    assert cfg.producer.max_in_flight == rule.max_in_flight  # ... replaced by the rule
    assert "(given)" not in capsys.readouterr().err


def test_other_engines_keep_two_producers_and_their_threads():
    base = C.load(cli.DEMO_CONFIG, ["producer.engine=fake"])
    assert run._split_cores(base, frozenset(), None) == (base, 2)


def test_a_local_run_makes_no_deltas_unless_the_user_asks():
    from launch import local

    base = C.load(cli.DEMO_CONFIG)
    assert base.snapshot.anchor_every > 0
    assert local.local_config(base, set()).snapshot.anchor_every == 0
    given = C.load(cli.DEMO_CONFIG, ["snapshot.anchor_every=5"])
    assert local.local_config(given, {"snapshot.anchor_every"}).snapshot.anchor_every == 5

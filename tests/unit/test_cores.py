"""The cores rule: how many hf producers launch starts and how many leases each holds, from what a
step costs; torch threads are left to the host's core board unless given."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from common import config as C
from launch import cli, cores
from launch.cli import run

# SmolLM2-135M-Instruct's shapes (docs/real_model.md)
SMOLLM2 = SimpleNamespace(
    hidden_size=576,
    num_attention_heads=9,
    num_key_value_heads=3,
    intermediate_size=1536,
    num_hidden_layers=30,
    vocab_size=49152,
)


def test_a_steps_costs_come_from_the_models_size_and_the_tasks_lengths():
    got = cores.costs(
        SMOLLM2, prompt_tokens=44, completion_tokens=8, group_size=4, prompts_per_step=8
    )
    # decoder 30 x 3.54M multiply-adds per position, head 28.3M per sampled position
    assert got.learner_gflop == pytest.approx(6 * (106.2e6 * 76 + 28.3e6 * 32) * 8 / 1e9, 0.01)
    assert got.generation_gflop == pytest.approx(2 * (106.2e6 * 76 + 28.3e6 * 33) * 8 / 1e9, 0.01)
    assert 0.7 < got.learner_share < 0.8  # training is three passes (forward and backward)


@pytest.mark.parametrize(
    ("n", "share", "producers"),
    [
        (1, 0.5, 1),
        (2, 0.5, 1),
        (2, 0.75, 1),
        (4, 0.5, 1),
        (8, 0.5, 2),
        (16, 0.5, 4),
        (16, 0.75, 2),
        (16, 0.25, 6),
    ],
)
def test_producers_fill_the_producers_share_of_the_cores_two_each(n, share, producers):
    step = cores.Costs(learner_gflop=share, generation_gflop=1 - share)
    got = cores.plan(n, max_staleness=2, prompts_per_step=8, step_costs=step)
    assert got.producers == producers
    assert got.max_in_flight * got.producers >= 3 * 8  # every lease the bound allows is held


def test_a_given_producer_count_splits_the_leases():
    got = cores.plan(8, max_staleness=0, prompts_per_step=8, producers=3)
    assert (got.producers, got.max_in_flight) == (3, 3)


def test_launch_keeps_what_the_user_gave_and_says_so(capsys):
    base, given = C.load_given(None, ["producer.max_in_flight=5"], fallback=cli.DEMO_CONFIG)
    cfg, n = run._split_cores(base, given, None)
    line = capsys.readouterr().err
    assert cfg.producer.max_in_flight == 5
    assert "5 leases in flight each (given)" in line
    assert f"cores: {cores.usable_cores()} usable" in line
    assert "torch threads shared by who has work" in line
    _, n = run._split_cores(base, frozenset(), 3)
    assert n == 3
    assert "3 producers (given)" in capsys.readouterr().err


def test_fixed_threads_are_said_to_be_given(capsys):
    base, given = C.load_given(None, ["model.torch_threads=1"], fallback=cli.DEMO_CONFIG)
    run._split_cores(base, given, None)
    assert "torch threads model.torch_threads = 1 (given)" in capsys.readouterr().err


def test_the_demo_configs_own_keys_are_not_given_so_the_cores_rule_sets_them(capsys):
    base, given = C.load_given(None, fallback=cli.DEMO_CONFIG)
    assert base.producer.max_in_flight == 4  # the demo file's value ...
    assert (base.model.torch_threads, base.producer.torch_threads) == (0, 0)  # shared
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

"""A consumer and two fake-engine producers as separate processes over loopback ZeroMQ.

The learner is real (the tiny model of conftest.py, trained on the fake tokens); everything
crosses real sockets and real files. What must hold: >= 20 steps, snapshots published and
reloaded (behaviour versions advance), the staleness bound in every trained group, a ledger
that balances, no group trained twice.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from ledger_invariant import assert_run_balanced
from procs import cli, endpoint, read_jsonl, stop

from common.files import run_files as RF
from common.wire import OUTCOMES

STEPS = 20
MAX_STALENESS = 2


def write_prompts(path: Path, n: int = 64) -> Path:
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n")
    return path


def consumer_args(run_dir: Path, model: Path, prompts: Path, *extra: str) -> list[str]:
    sets = [
        f"model.path={model}", "task.source=jsonl", f"task.path={prompts}",
        "sampling.group_size=4", "sampling.max_new_tokens=8", "train.prompts_per_step=4",
        "train.lr=1e-3", f"staleness.max_staleness={MAX_STALENESS}", "staleness.publish_every=1",
        "snapshot.dtype=float32", "model.torch_threads=1", "net.control_port=0",
        "net.producer_timeout_s=5", *extra,
    ]  # fmt: skip
    args = ["consumer", "--run-dir", str(run_dir), "--steps", str(STEPS)]
    for s in sets:
        args += ["--set", s]
    return args


def run_pipeline(
    tmp_path: Path, model: Path, *consumer_extra: str, producer_extra: tuple[str, ...] = ()
):
    run_dir = tmp_path / 'run "quoted" it\'s'  # flags reach the config typed, as written
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    consumer = cli(
        *consumer_args(run_dir, model, prompts, *consumer_extra), log=tmp_path / "consumer.log"
    )
    ep = endpoint(run_dir, [consumer])
    producers = [
        cli("producer", "--connect", ep, "--engine", "fake", "--id", name,
            "--set", "fake.latency_s=0.02", *producer_extra, log=tmp_path / f"{name}.log")
        for name in ("p1", "p2")
    ]  # fmt: skip
    try:
        code = consumer.wait(240)
        for p in producers:  # they notice the consumer is done and exit by themselves
            p.wait(60)
    finally:
        stop(consumer, *producers)
    return run_dir, code, [p.returncode for p in producers]


@pytest.mark.timeout(400)
def test_two_fake_producers_feed_a_real_learner_within_the_staleness_bound(
    tmp_path, tiny_model_dir
):
    run_dir, code, producer_codes = run_pipeline(tmp_path, tiny_model_dir)
    consumer_log = (tmp_path / "consumer.log").read_text()
    assert code == 0, consumer_log[-3000:]
    assert producer_codes == [0, 0]
    # the learner's process gives freed activations back (glibc's mmap threshold fixed)
    assert "host memory: blocks of 1024 KiB and more go back" in consumer_log

    metrics = read_jsonl(run_dir / RF.METRICS)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    snapshots = sorted(p.name for p in (run_dir / "snapshots").iterdir())
    assert snapshots[-1] == f"v{STEPS:06d}"
    # the final checkpoint's weights are the final float32 snapshot's file, not a second copy
    (saved,) = (run_dir / "checkpoints").glob(f"v{STEPS:06d}-*")
    final = run_dir / "snapshots" / snapshots[-1] / "model.safetensors"
    assert os.path.samefile(saved / "model.safetensors", final)

    leases = RF.read_leases(run_dir)
    trained = [r for r in leases if r.state == "trained"]
    assert len(trained) == STEPS * 4
    # producers reloaded snapshots: groups were sampled with many different versions
    behavior_versions = {r.behavior_version for r in trained}
    assert max(behavior_versions) >= STEPS - MAX_STALENESS - 1
    assert len(behavior_versions) >= STEPS // 2
    # the bound holds in every trained group
    assert all(0 <= r.staleness <= MAX_STALENESS for r in trained)
    # every lease ends exactly once, and nothing is trained twice
    ids = [r.lease_id for r in leases]
    assert len(ids) == len(set(ids))
    ledger = RF.read_ledger(run_dir)
    balance = ledger.balance
    assert balance.ok
    assert balance.open == 0
    assert balance.issued == len(leases)
    assert balance.trained == len(trained)
    assert Counter(r.state for r in leases) == Counter(
        {o: balance.final(o) for o in OUTCOMES if balance.final(o)}
    )
    # both producers contributed, and each one's leases balance
    assert set(ledger.by_producer) == {"p1", "p2"}
    assert all(ledger.count(p, "trained") > 0 for p in ledger.by_producer)
    assert_run_balanced(run_dir)


@pytest.mark.timeout(300)
def test_hf_producer_logprobs_equal_the_learners_after_every_reload(tmp_path, tiny_model_dir):
    """Synchronous mode: each step's groups were sampled with exactly the learner's weights, which
    change every step (large lr), so agreement to float32 rounding proves every reload took."""
    # 4 steps: by the 6th the large lr had made nearly every group's lengths equal (no signal),
    # and the run drew ~1,200 groups to fill it
    run_dir = synchronous_hf_run(
        tmp_path,
        tiny_model_dir,
        "log.completions_every=2",
        'log.report_to=["tensorboard"]',
        steps=4,
    )
    metrics = read_jsonl(run_dir / RF.METRICS)
    assert len(metrics) == 4
    for m in metrics:
        assert m["staleness_max"] == 0
        assert m["behavior_gap_abs_max"] < 1e-4, m["step"]
        assert abs(m["tis_weight_mean"] - 1) < 1e-4
    from safetensors.torch import load_file

    first = load_file(run_dir / "snapshots" / "v000003" / "model.safetensors")
    last = load_file(run_dir / "snapshots" / "v000004" / "model.safetensors")
    assert max(float((first[k] - last[k]).abs().max()) for k in first) > 1e-3  # weights moved
    _assert_observed(run_dir, metrics)


@pytest.mark.timeout(300)
def test_multi_turn_episodes_train_exactly_and_a_failing_environment_costs_its_episodes(
    tmp_path, tiny_model_dir
):
    """Synchronous, three model turns per episode, the environment in worker processes and
    raising on some second turns: every sampled token's behaviour log-prob equals the
    learner's, the failed episodes are counted and logged, the run finishes and balances."""
    run_dir = tmp_path / "run"
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    args = consumer_args(
        run_dir,
        tiny_model_dir,
        prompts,
        "staleness.max_staleness=0",
        "train.lr=0.02",
        "episodes.env=env_fixtures:flaky_length",
        "episodes.max_episode_tokens=64",
        "sampling.max_new_tokens=6",
        "log.completions_every=1",
        "log.completions_groups=1000",  # every group that arrives
    )
    args[args.index("--steps") + 1] = "3"
    _run_with_one_hf_producer(tmp_path, run_dir, args)
    metrics = read_jsonl(run_dir / RF.METRICS)
    assert len(metrics) == 3
    for m in metrics:
        assert m["staleness_max"] == 0
        assert m["behavior_gap_abs_max"] < 1e-4, m["step"]
        assert m["episode_sampled_frac"] < 1
        assert m["episode_turns_mean"] > 2
    assert sum(m["env_errors"] for m in metrics) > 0
    assert sum(m["episode_ends"].get("stop", 0) for m in metrics) > 0
    producers = json.loads((run_dir / "producers.json").read_text())
    assert "env_raised" in json.dumps(producers)
    log = (tmp_path / "hf1.log").read_text()
    assert "environment 'env_fixtures:flaky_length' raised RuntimeError: flaky on purpose" in log
    assert "(env_error) and is not trained" in log
    from common.files import completions_file as CF

    rows = CF.read(run_dir)
    assert any(r.finish_reason == "stop" for r in rows)
    assert any(r.finish_reason == "env_error" for r in rows)
    assert {r.turns for r in rows if r.finish_reason == "stop"} == {3}
    assert {r.turns for r in rows if r.finish_reason == "env_error"} == {2}  # raised at turn 2
    assert all("⟦turn 1⟧" in r.completion for r in rows)
    assert_run_balanced(run_dir)


def _run_with_one_hf_producer(tmp_path: Path, run_dir: Path, args: list[str]) -> None:
    """The consumer with `args` and one hf producer, to the consumer's clean exit."""
    consumer = cli(*args, log=tmp_path / "consumer.log")
    ep = endpoint(run_dir, [consumer])
    producer = cli(
        "producer", "--connect", ep, "--engine", "hf", "--id", "hf1", log=tmp_path / "hf1.log"
    )
    try:
        assert consumer.wait(240) == 0, (tmp_path / "consumer.log").read_text()[-3000:]
        producer.wait(60)
    finally:
        stop(consumer, producer)


def _assert_observed(run_dir: Path, metrics: list[dict]) -> None:
    """Per-function rewards crossed the wire, completions samples and the tracker were written
    by the learner's logger thread (docs/observability.md)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from common.files import completions_file as CF

    for m in metrics:  # one reward: its own mean is the reward over every arrived group
        (fn_mean,) = m["reward_fn_means"].values()
        assert fn_mean == pytest.approx(m["reward_mean_seen"], abs=1e-5)
    rows = CF.read(run_dir)
    assert sorted({r.step for r in rows}) == [0, 1, 2, 4]  # 0: the first groups, before a step
    assert all(set(r.rewards) == {"reward_fixtures:length"} for r in rows)
    assert all(r.reward == pytest.approx(r.rewards["reward_fixtures:length"]) for r in rows)
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("reward/reward_mean_seen")] == [1, 2, 3, 4]


def synchronous_hf_run(
    tmp_path: Path,
    model: Path,
    *extra: str,
    name: str = "run",
    producers: tuple[str, ...] = ("hf1",),
    steps: int = 4,
) -> Path:
    """A synchronous run (max_staleness 0, lr 0.02, a reward that varies: a signal) with hf
    producers, to its end; returns its run directory (logs: NAME-consumer.log, NAME-ID.log)."""
    run_dir = tmp_path / name
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    length_reward = 'rewards.fns=[{fn="reward_fixtures:length", weight=1.0}]'
    args = consumer_args(
        run_dir, model, prompts, "staleness.max_staleness=0", "train.lr=0.02", length_reward, *extra
    )
    args[args.index("--steps") + 1] = str(steps)
    consumer = cli(*args, log=tmp_path / f"{name}-consumer.log")
    ep = endpoint(run_dir, [consumer])
    procs = [
        cli("producer", "--connect", ep, "--engine", "hf", "--id", p,
            log=tmp_path / f"{name}-{p}.log")
        for p in producers
    ]  # fmt: skip
    try:
        assert consumer.wait(240) == 0, (tmp_path / f"{name}-consumer.log").read_text()[-3000:]
        for proc in procs:
            proc.wait(60)
    finally:
        stop(consumer, *procs)
    return run_dir


@pytest.mark.slow  # ~40 s on a quiet 2-core machine; replays check bit-exact repeats by default
@pytest.mark.timeout(400)
def test_a_synchronous_run_repeats_exactly_with_its_seed(tmp_path, tiny_model_dir):
    """Sampling seeds follow the lease, not the producer, and a batch is trained in lease order:
    two producers racing for leases must not change what is learned. The completions, hence the
    rewards, are the same; the behaviour log-probs come from batched forwards whose shapes depend
    on which leases a producer holds together, so they (and the weights) agree to float rounding.
    """
    runs = [
        synchronous_hf_run(tmp_path, tiny_model_dir, name=name, producers=("p1", "p2"))
        for name in ("a", "b")
    ]
    metrics = [read_jsonl(run / RF.METRICS) for run in runs]
    keys = ("reward_mean", "reward_std", "num_completion_tokens")
    assert [[m[k] for k in keys] for m in metrics[0]] == [[m[k] for k in keys] for m in metrics[1]]
    for m0, m1 in zip(*metrics, strict=True):
        assert m0["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5)
        assert m0["entropy"] == pytest.approx(m1["entropy"], rel=1e-5)
    from safetensors.torch import load_file

    final = [load_file(run / "snapshots" / "v000004" / "model.safetensors") for run in runs]
    assert max(float((final[0][k] - final[1][k]).abs().max()) for k in final[0]) < 1e-5
    producers = [RF.read_ledger(run).by_producer for run in runs]
    assert all(set(p) == {"p1", "p2"} for p in producers)

"""`asyncgrpo launch` through the CLI in a subprocess: the demo learns; Ctrl-C is clean."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import psutil
import pytest
from procs import cli, read_jsonl, stop, wait_for

from common.files import run_files as RF

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def no_child_survives(run_dir: Path) -> None:
    started = json.loads((run_dir / "processes.json").read_text())
    for name, pids in started.items():
        for pid in pids:
            try:
                proc = psutil.Process(pid)
                alive = proc.status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                alive = False
            assert not alive, f"{name} (pid {pid}) outlived the launcher"


def ledger_balances(run_dir: Path) -> RF.Ledger:
    ledger = RF.read_ledger(run_dir)
    assert ledger.balance.ok
    assert ledger.balance.open == 0
    leases = RF.read_leases(run_dir)
    assert len({r.lease_id for r in leases}) == len(leases) == ledger.balance.issued
    return ledger


def fake_launch(
    tmp_path: Path, model_dir: Path, *, steps: int, latency_s: float, evaluate: bool = False
):
    """`asyncgrpo launch` with the fake engine on the tiny model (scheduling, not learning)."""
    return cli(
        "launch", "--run-dir", str(tmp_path / "run"), "--steps", str(steps), "--no-live",
        "--eval" if evaluate else "--no-eval", "--engine", "fake", "--model", str(model_dir),
        "--set", "sampling.group_size=4", "--set", "train.prompts_per_step=4",
        "--set", "eval.learner_every_steps=0", "--set", f"fake.latency_s={latency_s}",
        log=tmp_path / "launch.log",
    )  # fmt: skip


def wait_for_steps(run_dir: Path, n: int, launcher) -> None:
    metrics = run_dir / RF.METRICS
    wait_for(lambda: metrics.exists() and len(read_jsonl(metrics)) >= n, timeout_s=200,
             what=f"{n} steps", procs=[launcher])  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_demo_launch_learns_and_leaves_a_complete_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    launcher = cli(
        "launch",
        "--run-dir",
        str(run_dir),
        "--steps",
        "200",
        "--no-live",
        log=tmp_path / "launch.log",
    )
    try:
        assert launcher.wait(800) == 0, (tmp_path / "launch.log").read_text()[-3000:]
    finally:
        stop(launcher)
    ev = json.loads((run_dir / "eval.json").read_text())
    assert ev["final_accuracy"] > ev["initial_accuracy"]
    assert ev["heldout_size"] > 100
    ledger_balances(run_dir)
    for name in ("reward", "staleness", "tis", "throughput", "lag"):
        assert (run_dir / "plots" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
    assert (run_dir / "summary.md").exists()
    assert (run_dir / "config.toml").exists()
    no_child_survives(run_dir)


@pytest.mark.slow  # ~50 s here: the demo model, three multi-turn steps, the final report
@pytest.mark.timeout(600)
def test_the_multi_turn_demo_launch_runs_episodes(tmp_path):
    """`asyncgrpo launch --env guess`, as docs/episodes.md shows it (a few steps): the demo
    model plays the built-in guessing game, several model turns an episode, and the run ends
    clean (the config `--env guess` picks: tests/unit/test_docs.py)."""
    run_dir = tmp_path / "run"
    args = ("--env", "guess", "--steps", "3", "--no-live", "--no-eval", "--run-dir", str(run_dir))
    launcher = cli("launch", *args, log=tmp_path / "launch.log")
    try:
        assert launcher.wait(500) == 0, (tmp_path / "launch.log").read_text()[-3000:]
    finally:
        stop(launcher)
    metrics = read_jsonl(run_dir / RF.METRICS)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["episode_turns_mean"] > 1 and m["env_errors"] == 0 for m in metrics)
    ledger_balances(run_dir)
    no_child_survives(run_dir)


@pytest.mark.timeout(300)
def test_ctrl_c_during_a_launch_stops_everything_and_keeps_a_loadable_final_snapshot(
    tmp_path, tiny_model_dir
):
    run_dir = tmp_path / "run"
    launcher = fake_launch(tmp_path, tiny_model_dir, steps=10000, latency_s=0.02)
    try:
        wait_for_steps(run_dir, 5, launcher)
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(120) == 130, (tmp_path / "launch.log").read_text()[-3000:]
    finally:
        stop(launcher)
    no_child_survives(run_dir)
    ledger_balances(run_dir)
    assert (run_dir / RF.SUMMARY).exists()
    steps = len(read_jsonl(run_dir / RF.METRICS))
    assert steps < 10000
    final = run_dir / "snapshots" / f"v{steps:06d}"
    from common.weights import snapshot as snap
    from consumer.evaluation.greedy import load_model

    manifest = snap.read_manifest(final)
    snap.verify_file(
        final / snap.WEIGHTS_FILE, expected_hash=manifest.hash, expected_bytes=manifest.num_bytes
    )
    model, _ = load_model(final)  # a complete HF model directory
    assert model.num_parameters() > 0
    assert (run_dir / "checkpoints" / "LATEST").exists()


@pytest.mark.timeout(300)
def test_a_producer_that_dies_is_restarted_and_the_run_finishes(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    launcher = fake_launch(tmp_path, tiny_model_dir, steps=40, latency_s=0.05)
    try:
        wait_for_steps(run_dir, 3, launcher)
        victim = json.loads((run_dir / "processes.json").read_text())["p1"][0]
        psutil.Process(victim).kill()
        assert launcher.wait(240) == 0, (tmp_path / "launch.log").read_text()[-3000:]
    finally:
        stop(launcher)
    pids = json.loads((run_dir / "processes.json").read_text())
    assert len(pids["p1"]) == 2, pids  # the original and its replacement
    assert pids["p1"][0] == victim
    assert "producer p1 exited with -9: restart 1" in (tmp_path / "launch.log").read_text()
    ledger = ledger_balances(run_dir)
    assert ledger.balance.trained == 40 * 4
    assert len(read_jsonl(run_dir / RF.METRICS)) == 40
    no_child_survives(run_dir)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_launch_resume_continues_a_finished_run_with_the_config_it_was_started_with(
    tmp_path, tiny_model_dir
):
    run_dir = tmp_path / "run"
    first = fake_launch(tmp_path, tiny_model_dir, steps=4, latency_s=0.01)
    try:
        assert first.wait(240) == 0, (tmp_path / "launch.log").read_text()[-3000:]
    finally:
        stop(first)
    again = cli("launch", "--run-dir", str(run_dir), "--no-live", log=tmp_path / "again.log")
    assert again.wait(120) == 2  # the hint names options launch has ...
    said = (tmp_path / "again.log").read_text()
    assert "pass --resume to continue it, or --force" in said
    resumed = cli(  # ... and taken at its word, with no --config: the run's own config.toml
        "launch", "--run-dir", str(run_dir), "--resume", "--steps", "7", "--no-live",
        log=tmp_path / "resumed.log",
    )  # fmt: skip
    try:
        assert resumed.wait(240) == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    finally:
        stop(resumed)
    assert [r["step"] for r in read_jsonl(run_dir / RF.METRICS)] == list(range(1, 8))
    assert "resumed at version 4" in (run_dir / RF.CONSUMER_LOG).read_text()
    ledger_balances(run_dir)
    no_child_survives(run_dir)


@pytest.mark.timeout(300)
def test_a_second_ctrl_c_skips_the_final_evaluation_and_still_writes_the_summary(
    tmp_path, tiny_model_dir
):
    run_dir, log = tmp_path / "run", tmp_path / "launch.log"
    launcher = fake_launch(tmp_path, tiny_model_dir, steps=10000, latency_s=0.02, evaluate=True)
    try:
        wait_for_steps(run_dir, 3, launcher)
        launcher.send_signal(signal.SIGINT)
        wait_for(lambda: "stopping:" in log.read_text(), timeout_s=60,
                 what="the stopping line", procs=[launcher])  # fmt: skip
        stopping = [x for x in log.read_text().splitlines() if x.startswith("stopping:")]
        assert stopping[0].endswith("skip the final evaluation)")  # one line, never wrapped
        launcher.send_signal(signal.SIGINT)
        assert launcher.wait(120) == 130, log.read_text()[-3000:]
    finally:
        stop(launcher)
    said = log.read_text()
    assert "→ final (v" not in said  # the held-out line of a final evaluation
    assert (run_dir / RF.SUMMARY).exists() or f"asyncgrpo report {run_dir}" in said
    no_child_survives(run_dir)
    ledger_balances(run_dir)

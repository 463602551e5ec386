"""A stop request ends any run in bounded time, whatever the groups: here every group is dropped
(all rewards equal), so the learner never completes a step, and SIGINT must still end the run
with exit 0, a balanced ledger and a checkpoint; a second SIGINT ends it too."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from ledger_invariant import assert_run_balanced
from procs import cli, endpoint, stop, wait_for

from common.files import run_files as RF
from common.files import run_state as RS


def _dropped(run_dir: Path) -> int:
    ledger = RF.latest_ledger(run_dir)
    return ledger.balance.dropped_zero_variance if ledger is not None else 0


def _log(tmp_path: Path) -> str:
    return (tmp_path / "consumer.log").read_text()


def _start(tmp_path: Path, *sets: str, dropped: int = 20) -> tuple[Path, list]:
    """A consumer whose every group is dropped (fake rewards always 0) and two producers."""
    run_dir = tmp_path / "run"
    cons = cli(
        "consumer", "--run-dir", str(run_dir), "--steps", "50",
        "--set", "train.simulate_step_s=0.1", "--set", "net.control_port=0",
        "--set", "sampling.group_size=4", "--set", "train.prompts_per_step=4",
        "--set", "net.heartbeat_s=0.2", *(a for s in sets for a in ("--set", s)),
        log=tmp_path / "consumer.log",
    )  # fmt: skip
    procs = [cons]
    ep = endpoint(run_dir, procs)
    for name in ("p1", "p2"):
        args = ["producer", "--connect", ep, "--engine", "fake", "--id", name]
        for s in ("fake.reward_p=0.0", "fake.latency_s=0.01", "net.heartbeat_s=0.2"):
            args += ["--set", s]
        procs.append(cli(*args, log=tmp_path / f"{name}.log"))
    registered = lambda: all(f"producer {n} registered" in _log(tmp_path) for n in ("p1", "p2"))  # noqa: E731
    if dropped:
        wait_for(
            lambda: registered() and _dropped(run_dir) >= dropped,
            timeout_s=120,
            what=f"both producers and {dropped} dropped groups",
            procs=procs,
        )
    return run_dir, procs


@pytest.mark.timeout(180)
@pytest.mark.parametrize("signals", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_stop_request_ends_a_run_whose_every_group_is_dropped(tmp_path, signals):
    run_dir, procs = _start(tmp_path)
    cons = procs[0]
    try:
        cons.send_signal(signal.SIGINT)
        if signals == 2:  # once the first is handled (a pending signal is not queued twice)
            wait_for(lambda: "finishing the current step" in _log(tmp_path), timeout_s=60,
                     what="the first signal handled", procs=procs[:1])  # fmt: skip
            cons.send_signal(signal.SIGINT)
        # bounded by the test's timeout only: the issue was a consumer that never stopped
        assert cons.wait(60) == 0, (tmp_path / "consumer.log").read_text()[-3000:]
        for p in procs[1:]:  # they heard that the run is over
            assert p.wait(60) == 0
    finally:
        stop(*procs)
    log = _log(tmp_path)
    assert "finishing the current step" in log
    if signals == 2:
        assert "not waiting for producers" in log
    ledger = assert_run_balanced(run_dir)
    assert ledger.balance.trained == 0
    assert ledger.balance.dropped_zero_variance >= 20
    assert (run_dir / "checkpoints" / "LATEST").exists()
    final = RS.read_final(run_dir)
    assert final is not None
    assert (final.ended, final.finished) == ("stopped", False)


@pytest.mark.timeout(180)
def test_a_run_without_a_learning_signal_stops_itself_with_exit_3_and_the_reason(tmp_path):
    run_dir, procs = _start(tmp_path, "run.no_signal_groups=30", dropped=0)
    cons = procs[0]
    try:
        assert cons.wait(120) == 3, (tmp_path / "consumer.log").read_text()[-3000:]
        for p in procs[1:]:  # they heard that the run is over
            assert p.wait(60) == 0
    finally:
        stop(*procs)
    final = RS.read_final(run_dir)
    assert final is not None
    assert final.ended == "no_signal"
    assert final.reason.startswith("no learning signal in 30 groups in a row over ")
    assert "(run.no_signal_groups = 30 or run.no_signal_s = 300 s): every completion scored 0" in (
        final.reason
    )
    said = RS.read_signal(run_dir)
    assert said is not None
    assert (said.stopped, said.streak, said.with_signal) == (True, 30, 0)
    assert "stopping: no learning signal in 30 groups" in _log(tmp_path)
    assert assert_run_balanced(run_dir).balance.trained == 0

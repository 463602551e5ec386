"""Either side may die and come back: no group is lost or trained twice, the ledger balances.

Real processes over loopback; a simulated learner step keeps these quick (the lease book,
checkpoint and resume logic are the same as with a model).
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from ledger_invariant import assert_run_balanced
from procs import cli, endpoint, read_jsonl, stop, wait_for

from common.files import completions_file as CF
from common.files import run_files as RF

P = 4  # prompts per step


def prompts_file(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": f"{i}*2=", "answer": str(2 * i)}) + "\n" for i in range(50))
    )
    return path


def consumer(tmp_path: Path, run_dir: Path, steps: int, *extra: str, log: str = "consumer.log"):
    sets = [
        "train.simulate_step_s=0.05", "sampling.group_size=4", f"train.prompts_per_step={P}",
        "net.control_port=0", "net.producer_timeout_s=3", "net.heartbeat_s=0.2",
        "net.resend_after_s=2", "train.checkpoint_every=5", "staleness.max_staleness=2",
        "task.source=jsonl", f"task.path={prompts_file(tmp_path)}",
    ]  # fmt: skip
    args = ["consumer", "--run-dir", str(run_dir), "--steps", str(steps)]
    for s in sets:
        args += ["--set", s]
    return cli(*args, *extra, log=tmp_path / log)  # extra last: its --set wins


def producer(
    tmp_path: Path, ep: str, name: str, *extra: str, log: str | None = None, latency_s: float = 0.05
):
    return cli(
        "producer", "--connect", ep, "--engine", "fake", "--id", name,
        "--set", f"fake.latency_s={latency_s}", "--set", "net.heartbeat_s=0.2", *extra,
        log=tmp_path / (log or f"{name}.log"),
    )  # fmt: skip


def steps_done(run_dir: Path) -> int:
    path = run_dir / RF.METRICS
    return len(read_jsonl(path)) if path.exists() else 0


def _issued(run_dir: Path, producer_id: str) -> int:
    ledger = RF.latest_ledger(run_dir)
    return ledger.count(producer_id, "issued") if ledger is not None else 0


def check_ledger(run_dir: Path, steps: int) -> RF.Ledger:
    leases = RF.read_leases(run_dir)
    ids = [r.lease_id for r in leases]
    assert len(ids) == len(set(ids)), "a lease ended twice"
    trained = [r for r in leases if r.state == "trained"]
    assert len(trained) == steps * P
    assert sorted({r.trained_step for r in trained}) == list(range(steps))
    metrics = read_jsonl(run_dir / RF.METRICS)
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    ledger = assert_run_balanced(run_dir)  # in total and per producer, against leases.jsonl
    assert ledger.balance.issued == len(leases)
    return ledger


def stream_holds_the_trained_timeline(run_dir: Path, steps: int) -> None:
    """The recorded stream (cut back at the resume) lists each step's trained groups as the
    ledger does, once, in lease order."""
    from consumer.stream.reader import index

    rec = index(run_dir / "stream")
    assert [s.entry.version for s in rec.steps] == list(range(steps))
    by_step: dict[int, list[int]] = {}
    for r in RF.read_leases(run_dir):
        if r.state == "trained":
            by_step.setdefault(r.trained_step, []).append(r.lease_id)
    assert [list(s.entry.kept) for s in rec.steps] == [sorted(by_step[v]) for v in range(steps)]


@pytest.mark.timeout(300)
def test_a_killed_consumer_resumes_from_its_checkpoint_and_producers_reconnect(tmp_path):
    run_dir = tmp_path / "run"
    first = consumer(tmp_path, run_dir, 30)
    procs = [first]
    try:
        ep = endpoint(run_dir, procs)
        procs += [producer(tmp_path, ep, "p1"), producer(tmp_path, ep, "p2")]
        wait_for(lambda: steps_done(run_dir) >= 12, timeout_s=120, what="12 steps", procs=procs)
        first.send_signal(signal.SIGKILL)  # no clean shutdown: only the checkpoint survives
        first.wait(30)
        second = consumer(tmp_path, run_dir, 30, "--resume", log="consumer2.log")
        procs.append(second)
        assert second.wait(180) == 0, (tmp_path / "consumer2.log").read_text()[-3000:]
        for p in procs[1:3]:
            p.wait(60)
    finally:
        stop(*procs)
    assert "resumed at version 10" in (tmp_path / "consumer2.log").read_text()
    check_ledger(run_dir, 30)
    stream_holds_the_trained_timeline(run_dir, 30)
    for name in ("p1", "p2"):  # the same producer processes served both consumer incarnations
        assert "registering again" in (tmp_path / f"{name}.log").read_text()


@pytest.mark.timeout(300)
def test_a_killed_producer_is_replaced_and_its_leases_are_reissued(tmp_path):
    """The victim is the only producer: it takes two leases and sits on them (it generates
    for ever), so no step can be trained until its replacement, registering under the same
    id and holding nothing, makes the consumer expire them ("not held") and lease their
    prompts again. The run cannot finish before that, however slowly the replacement starts."""
    run_dir = tmp_path / "run"
    # A producer timeout beyond the test's: the victim's leases can only end through the
    # replacement's registration (which says what it holds), never through its silence.
    cons = consumer(tmp_path, run_dir, 25, "--set", "net.producer_timeout_s=600")
    procs = [cons]
    try:
        ep = endpoint(run_dir, procs)
        victim = producer(tmp_path, ep, "p1", "--max-in-flight", "2", latency_s=3600.0)
        procs.append(victim)
        # the ledger counts leases issued per producer (rewritten within a few seconds)
        wait_for(lambda: _issued(run_dir, "p1") > 0, timeout_s=120, what="a lease for p1",
                 procs=procs)  # fmt: skip
        assert steps_done(run_dir) == 0  # nothing delivered: the victim holds its leases
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        procs.append(producer(tmp_path, ep, "p1", log="p1-again.log"))  # as the launcher does
        assert cons.wait(180) == 0, (tmp_path / "consumer.log").read_text()[-3000:]
    finally:
        stop(*procs)
    ledger = check_ledger(run_dir, 25)
    leases = RF.read_leases(run_dir)
    lost = [r for r in leases if r.state == "expired" and r.reason == "not held"]
    assert lost, "the killed producer's leases must expire when its replacement registers"
    assert all(r.producer_id == "p1" for r in lost)
    assert len(lost) <= 2  # the victim's (the replacement's own can end only at shutdown)
    # their prompts were leased again, and trained (by the replacement: the only producer left)
    reissued = {r.prompt_index for r in leases if r.state == "trained"}
    assert {r.prompt_index for r in lost} <= reissued
    assert ledger.count("p1", "trained") == 25 * P


def _snapshot_versions(run_dir: Path) -> list[int]:
    from common.weights import snapshot as snap

    return snap.list_versions(run_dir / "snapshots")


OLD = 999  # the prompt index of the completions samples the interrupted timeline wrote


def sample(step: int) -> CF.CompletionRow:
    return CF.CompletionRow(step, OLD, step - 1, "1+1=", "2", 1.0, {}, 2, "stop")


@pytest.mark.timeout(300)
def test_a_resume_stopped_at_once_drops_the_old_timeline_and_its_producers_hear_the_end(tmp_path):
    """Killed after publishing v12 with a checkpoint at 10; resumed and stopped (SIGTERM) right
    away, while the producers are still waiting out their requests to the killed consumer. The
    snapshots above 10 (the interrupted timeline) are gone, and so are its completions samples;
    final.json names the version the resumed run ended with (the highest on disk again), and the
    resumed consumer waits for the producers it knows from its checkpoint: they re-register,
    hear the end and exit 0."""
    from common.weights import snapshot as snap

    run_dir = tmp_path / "run"
    first = consumer(tmp_path, run_dir, 30)
    procs = [first]
    try:
        ep = endpoint(run_dir, procs)
        producers = [producer(tmp_path, ep, "p1"), producer(tmp_path, ep, "p2")]
        procs += producers
        wait_for(lambda: max(_snapshot_versions(run_dir), default=0) >= 12, timeout_s=120,
                 what="snapshot v12", procs=procs)  # fmt: skip
        first.send_signal(signal.SIGKILL)
        first.wait(30)
        assert snap.final_version(run_dir) is None  # killed: it never ended
        CF.append(run_dir, [sample(9), sample(11), sample(12)])  # before and after v10
        second = consumer(tmp_path, run_dir, 30, "--resume", log="consumer2.log")
        procs.append(second)
        log = tmp_path / "consumer2.log"
        wait_for(lambda: "listening on" in log.read_text(), timeout_s=120,
                 what="the resumed consumer to listen", procs=[second])  # fmt: skip
        second.send_signal(signal.SIGTERM)
        assert second.wait(120) == 0, log.read_text()[-3000:]
        for p in producers:  # bounded: told "finished" after re-registering
            assert p.wait(60) == 0
    finally:
        stop(*procs)
    assert "resumed at version 10" in log.read_text()
    final = snap.final_version(run_dir)
    assert final is not None
    assert 10 <= final < 12
    assert max(_snapshot_versions(run_dir)) == final
    steps = read_jsonl(run_dir / RF.METRICS)
    assert [m["step"] for m in steps] == list(range(1, final + 1))
    assert [r.step for r in CF.read(run_dir) if r.prompt_index == OLD] == [9]  # 11, 12 gone
    assert_run_balanced(run_dir)
    for name in ("p1", "p2"):
        assert "needs no more groups" in (tmp_path / f"{name}.log").read_text()


@pytest.mark.timeout(120)
def test_a_producer_whose_consumer_vanished_exits_after_the_consumer_timeout(tmp_path):
    run_dir = tmp_path / "run"
    cons = consumer(tmp_path, run_dir, 1000)
    procs = [cons]
    try:
        ep = endpoint(run_dir, procs)
        lonely = cli(
            "producer", "--connect", ep, "--engine", "fake", "--id", "p1",
            "--set", "net.heartbeat_s=0.2", "--set", "net.consumer_timeout_s=3",
            log=tmp_path / "p1.log",
        )  # fmt: skip
        procs.append(lonely)
        wait_for(lambda: steps_done(run_dir) >= 2, timeout_s=60, what="2 steps", procs=procs)
        cons.send_signal(signal.SIGKILL)  # gone without a word
        cons.wait(30)
        assert lonely.wait(60) == 3
    finally:
        stop(*procs)
    text = (tmp_path / "p1.log").read_text()
    assert "no answer from the consumer" in text
    assert "net.consumer_timeout_s = 3" in text

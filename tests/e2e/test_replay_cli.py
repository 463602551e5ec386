"""`asyncgrpo replay` through the CLI: an asynchronous run (max_staleness 2, two producers) is
trained again from its recorded stream with every snapshot hash equal to the original's, also
after a kill -9 and --resume; a changed TIS cap trains, differs and is overlaid by `report`; a
corrupt byte is refused with the file and the step named."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from procs import cli, endpoint, read_jsonl, stop, wait_for

from common.files import run_files as RF
from consumer.stream import segments as S

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEPS = 12


def asyncgrpo(*args: str, timeout_s: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launch.cli", *args],
        capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip


def hashes_equal(out: str) -> int:
    """The number of versions compared, from a replay's last line (fails if one differs)."""
    found = re.search(r"all (\d+) versions compared equal the original's", out)
    assert found, out[-3000:]
    return int(found.group(1))


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded demo, asynchronous (max_staleness 2) with two hf producers."""
    tmp = tmp_path_factory.mktemp("demo")
    run_dir = tmp / "run"
    launcher = cli(
        "launch", "--run-dir", str(run_dir), "--steps", str(STEPS), "--producers", "2",
        "--no-live", "--no-eval", "--set", "staleness.max_staleness=2",
        "--set", "eval.learner_every_steps=4", "--set", "eval.learner_prompts=20",
        "--set", "snapshot.keep_last=1000", log=tmp / "launch.log",
    )  # fmt: skip
    try:
        assert launcher.wait(600) == 0, (tmp / "launch.log").read_text()[-3000:]
    finally:
        stop(launcher)
    return run_dir


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_async_demo_run_replays_with_every_snapshot_hash_equal(demo_run, tmp_path):
    done = asyncgrpo("replay", "--verify", str(demo_run), "--run-dir", str(tmp_path / "replay"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert hashes_equal(done.stdout) == STEPS + 1  # versions 0..STEPS
    metrics = read_jsonl(tmp_path / "replay" / RF.METRICS)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))

    def heldout(lines: list[dict]) -> dict[int, float]:
        return {m["step"]: m["heldout_accuracy"] for m in lines if "heldout_accuracy" in m}

    # evaluated beside training, in a process of its own: the same accuracy at the same steps
    assert heldout(metrics) == heldout(read_jsonl(demo_run / RF.METRICS)) != {}
    assert sorted(heldout(metrics)) == [4, 8, 12]
    assert RF.read_ledger(tmp_path / "replay").balance.trained == STEPS * 8
    assert (tmp_path / "replay" / "plots" / "reward.png").read_bytes()[:8] == PNG_MAGIC


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_changed_tis_cap_trains_differs_and_is_overlaid(demo_run, tmp_path):
    cap = tmp_path / "cap"
    done = asyncgrpo(
        "replay", "--verify", str(demo_run), "--run-dir", str(cap), "--set", "loss.tis_cap=1.001"
    )
    assert done.returncode == 1, done.stderr[-3000:]  # --verify: the weights differ
    assert re.search(
        r"version \d+ \(after step \d+\) is the first of 13 compared that differs "
        r"from the original's; max \|Δparam\| there = \d",
        done.stderr,
    ), done.stderr
    original = read_jsonl(demo_run / RF.METRICS)
    replayed = read_jsonl(cap / RF.METRICS)
    assert len(replayed) == STEPS
    assert [m["loss"] for m in replayed] != [m["loss"] for m in original]
    shown = asyncgrpo("report", str(demo_run), str(cap), "--out", str(tmp_path / "cmp.png"))
    assert shown.returncode == 0, shown.stderr
    assert (tmp_path / "cmp.png").read_bytes()[:8] == PNG_MAGIC
    refused = asyncgrpo("replay", str(demo_run), "--set", "sampling.temperature=0.7")
    assert refused.returncode == 2
    assert "sampling.temperature cannot change" in refused.stderr


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_corrupt_byte_is_refused_naming_the_file_and_the_step(demo_run, tmp_path):
    run = tmp_path / "copy"
    shutil.copytree(demo_run, run, ignore=shutil.ignore_patterns("snapshots", "checkpoints"))
    (segment,) = S.segments(run / "stream")
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x40
    segment.write_bytes(bytes(data))
    done = asyncgrpo("replay", str(run), "--run-dir", str(tmp_path / "replay"))
    assert done.returncode == 2
    assert re.search(rf"{segment.name}: corrupt at byte \d+.*\(step \d+\)", done.stderr), (
        done.stderr
    )
    assert not (tmp_path / "replay" / RF.METRICS).exists()  # refused before training


def tiny_consumer(tmp_path: Path, run_dir: Path, model: Path, *extra: str, log: str):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(f'{{"prompt": "{i}+{i}=", "answer": "{2 * i}"}}\n' for i in range(64))
    )
    sets = [
        f"model.path={model}", "task.source=jsonl", f"task.path={prompts}",
        "sampling.group_size=4", "sampling.max_new_tokens=8", "train.prompts_per_step=4",
        "train.lr=1e-3", "staleness.max_staleness=2", "snapshot.dtype=float32",
        "snapshot.keep_last=1000", "model.torch_threads=1", "net.control_port=0",
        "net.producer_timeout_s=5", "net.heartbeat_s=0.2", "train.checkpoint_every=5",
    ]  # fmt: skip
    args = ["consumer", "--run-dir", str(run_dir), "--steps", "16"]
    for s in sets:
        args += ["--set", s]
    return cli(*args, *extra, log=tmp_path / log)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_killed_and_resumed_replays_with_every_snapshot_hash_equal(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    first = tiny_consumer(tmp_path, run_dir, tiny_model_dir, log="consumer.log")
    procs = [first]
    try:
        ep = endpoint(run_dir, procs)
        procs += [
            cli("producer", "--connect", ep, "--engine", "fake", "--id", name,
                "--set", "fake.latency_s=0.05", "--set", "net.heartbeat_s=0.2",
                log=tmp_path / f"{name}.log")
            for name in ("p1", "p2")
        ]  # fmt: skip
        metrics = run_dir / RF.METRICS
        wait_for(lambda: metrics.exists() and len(read_jsonl(metrics)) >= 8, timeout_s=200,
                 what="8 steps", procs=procs)  # fmt: skip
        first.send_signal(signal.SIGKILL)  # mid-run: the stream's tail may be torn
        first.wait(30)
        second = tiny_consumer(tmp_path, run_dir, tiny_model_dir, "--resume", log="consumer2.log")
        procs.append(second)
        assert second.wait(300) == 0, (tmp_path / "consumer2.log").read_text()[-3000:]
    finally:
        stop(*procs)
    assert "resumed at version 5" in (tmp_path / "consumer2.log").read_text()
    done = asyncgrpo("replay", "--verify", str(run_dir), "--run-dir", str(tmp_path / "replay"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert hashes_equal(done.stdout) == 17  # versions 0..16, across both incarnations

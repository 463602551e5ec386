"""`asyncgrpo stress` through the CLI: results checked against each run's ledger; Ctrl-C and
--resume; producers started elsewhere (--external-producers); the hf engine on a user's config."""

from __future__ import annotations

import csv
import json
import re
import signal
import socket
from pathlib import Path

import pytest
from procs import cli, stop, wait_for
from typer.testing import CliRunner

from common.files import run_files as RF
from launch.cli import app

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FAKE = (
    "--set", "fake.latency_s=0.05", "--set", "train.simulate_step_s=0.05",
    "--set", "sampling.group_size=4",
    "--set", "train.prompts_per_step=4",
)  # fmt: skip


def rows_of(out: Path) -> list[dict[str, str]]:
    with open(out / "results.csv") as f:
        return list(csv.DictReader(f))


def finish(proc, log: Path, timeout_s: float = 360) -> int:
    try:
        return proc.wait(timeout_s)
    except Exception:
        print(log.read_text()[-3000:])
        raise
    finally:
        stop(proc)


def check_against_runs(out: Path, rows: list[dict[str, str]], steps: int) -> None:
    """Every row agrees with its run's ledger and leases; the bound held; equal wall-clock."""
    sync = next(r for r in rows if r["max_staleness"] == "0")
    for row in rows:
        assert row["status"] == "ok", row["error"]
        run_dir = out / "runs" / row["setting"]
        balance = RF.read_ledger(run_dir).balance
        assert balance.ok
        for key in ("trained", "dropped_stale", "expired"):
            assert int(row[key]) == balance.final(key), key
        assert int(row["steps"]) == steps
        bound = int(row["max_staleness"])
        lags = [r.staleness for r in RF.read_leases(run_dir) if r.state == "trained"]
        assert max(lags) <= bound
        assert min(lags) >= 0
        # every asynchronous setting ran at least as long as the synchronous one took
        assert float(row["equal_time_s"]) == pytest.approx(float(sync["wall_s"]), rel=1e-3)
        assert float(row["run_wall_s"]) >= float(row["equal_time_s"]) * 0.999
        assert row["reward_at_equal_time"] != ""
    assert int(sync["trained"]) == steps * 4  # the synchronous run stops at --steps
    assert float(sync["speedup_vs_sync"]) == 1.0


@pytest.mark.timeout(500)
def test_a_sweep_stopped_by_ctrl_c_resumes_where_it_stopped(tmp_path):
    out, log = tmp_path / "sweep", tmp_path / "stress.log"
    args = ("stress", "--out", str(out), "--max-staleness", "0,2", "--steps", "8", *FAKE)
    sweep = cli(*args, log=log)
    second = out / "runs" / "ms2-p2-token-truncate-s0"
    try:  # Ctrl-C while the second setting runs
        wait_for(lambda: (second / RF.ENDPOINTS).exists(), timeout_s=300,
                 what="the second setting's consumer", procs=[sweep])  # fmt: skip
        sweep.send_signal(signal.SIGINT)
        assert sweep.wait(120) == 130, log.read_text()[-3000:]
    finally:
        stop(sweep)
    assert [r["setting"] for r in rows_of(out)] == ["ms0-p2-token-truncate-s0"]
    assert not (second / "result.json").exists()
    first = out / "runs" / "ms0-p2-token-truncate-s0" / "result.json"
    kept = first.read_text()

    # the same directory without --resume: refused before anything starts (so in this process)
    again = CliRunner().invoke(app, list(args))
    assert again.exit_code == 2, again.output
    assert "pass --resume" in again.output

    resumed = cli(*args, "--resume", log=log)
    assert finish(resumed, log) == 0, log.read_text()[-3000:]
    assert first.read_text() == kept  # skipped, not run again
    rows = rows_of(out)
    assert [r["max_staleness"] for r in rows] == ["0", "2"]
    check_against_runs(out, rows, steps=8)
    assert rows[0]["placement"] == "learner cpu; p1 cpu; p2 cpu"
    for name in ("throughput_vs_staleness", "idle_fractions", "reward_vs_time"):
        assert (out / "plots" / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
    summary = (out / "summary.md").read_text()
    assert "Staleness sweep" in summary
    assert "## Verdict" in summary
    assert "- Seeds per setting: 1." in summary
    assert f"on {rows[0]['cores']} usable cores" in summary
    assert float(rows[0]["load_mean"]) >= 0
    said = log.read_text()  # each setting's progress lines say which it is, never "step 9/8"
    assert "[max_staleness 2, seed 0, 2 producers, IS token-truncate] [" in said
    assert all(int(m[1]) <= int(m[2]) for m in re.finditer(r"step (\d+)/(\d+)", said))


def a_port() -> int:
    """A port the OS just handed out: external producers need one fixed address for the whole
    sweep, so it cannot be read back from the consumer like everywhere else."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_settings_wait_for_every_external_producer_and_name_their_hosts(tmp_path):
    out, log, port = tmp_path / "sweep", tmp_path / "stress.log", a_port()
    sweep = cli(
        "stress", "--out", str(out), "--max-staleness", "0,2", "--steps", "6", *FAKE,
        "--external-producers", "2", "--bind", f"127.0.0.1:{port}", log=log,
    )  # fmt: skip
    first = out / "runs" / "ms0-p2-token-truncate-s0"

    def producer(name: str):
        return cli(
            "producer", "--follow", "--connect", f"tcp://127.0.0.1:{port}", "--engine", "fake",
            "--id", name, "--set", "fake.latency_s=0.05", "--set", "net.consumer_timeout_s=20",
            log=tmp_path / f"{name}.log",
        )  # fmt: skip

    producers = [producer("e1")]
    try:  # the second producer comes only once the first is registered: nothing starts before
        wait_for(lambda: (first / "consumer.log").exists()
                 and "producer e1 registered" in (first / "consumer.log").read_text(),
                 timeout_s=300, what="e1's registration", procs=[sweep, *producers])  # fmt: skip
        producers.append(producer("e2"))
        assert finish(sweep, log) == 0, log.read_text()[-3000:]
        for p in producers:  # served both runs, then found no next consumer: done
            assert p.wait(120) == 0
    finally:
        stop(sweep, *producers)
    rows = rows_of(out)
    check_against_runs(out, rows, steps=6)
    for row in rows:
        assert row["placement"] == "2 external producers"
        assert json.loads(row["hosts"]) == {socket.gethostname(): ["e1", "e2"]}
        run_dir = out / "runs" / row["setting"]
        # both there from the first step: the learner's clock starts once both are ready
        log = (run_dir / RF.CONSUMER_LOG).read_text()
        assert f"2 producers ready (e1@{socket.gethostname()}, e2@" in log
        assert sorted(RF.read_producers(run_dir)) == ["e1", "e2"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_hf_sweep_on_a_user_config_scores_its_heldout_split(tmp_path):
    from common.task.synthetic import make_examples

    def jsonl(path: Path, examples) -> Path:
        path.write_text("".join(json.dumps({"question": e.prompt, "answer": e.answer}) + "\n"
                                for e in examples))  # fmt: skip
        return path

    train = jsonl(tmp_path / "train.jsonl", make_examples("train", 64))
    held = jsonl(tmp_path / "heldout.jsonl", make_examples("heldout", 16))
    config = tmp_path / "mine.toml"
    config.write_text(f"""
[model]
path = "demo"
torch_threads = 1
[task]
source = "jsonl"
path = "{train}"
prompt_field = "question"
[[rewards.fns]]
fn = "reward_fixtures:sum_is_right"
[sampling]
group_size = 4
max_new_tokens = 5
[train]
prompts_per_step = 4
[eval]
path = "{held}"
[snapshot]
dtype = "float32"
keep_last = 1
[producer]
max_in_flight = 2
torch_threads = 1
""")
    out, log = tmp_path / "sweep", tmp_path / "stress.log"
    sweep = cli(
        "stress", "--out", str(out), "--config", str(config), "--engine", "hf",
        "--max-staleness", "0,2", "--steps", "4", "--target-reward", "0.01", log=log,
    )  # fmt: skip
    assert finish(sweep, log, timeout_s=800) == 0, log.read_text()[-3000:]
    rows = rows_of(out)
    assert [r["setting"] for r in rows] == ["ms0-p2-token-truncate-s0", "ms2-p2-token-truncate-s0"]
    for row in rows:
        assert row["status"] == "ok", row["error"]
        assert row["engine"] == "hf"
        assert row["heldout"] == "mean reward, greedy, heldout.jsonl"
        # the snapshot at equal steps, kept over keep_last: version 4, or (when a newer snapshot
        # superseded its write) the newest written before it
        assert 1 <= int(row["final_version"]) <= 4
        assert 0 <= float(row["final_accuracy"]) <= 1
        assert 0 <= float(row["accuracy_at_equal_time"]) <= 1
        assert int(row["equal_time_version"]) >= 0
        assert row["reward_at_equal_time"] != ""
        assert float(row["target_reward"]) == 0.01
    sync = rows[0]
    assert sync["final_version"] == "4"  # the synchronous run ends with it
    assert sync["accuracy_at_equal_time"] == sync["final_accuracy"]
    assert sync["equal_time_version"] == sync["final_version"]
    assert (out / "plots" / "accuracy_vs_staleness.png").read_bytes()[:8] == PNG_MAGIC

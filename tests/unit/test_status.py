"""What an operator sees of a run from its files: the progress line (launcher and a consumer run
by hand), `asyncgrpo status`, the report's summary; reward failures shown in each."""

from __future__ import annotations

import json
import logging

from typer.testing import CliRunner

from common.files import metrics as M
from common.files import run_files as RF
from common.files import run_state as RS
from launch.cli import app
from launch.dashboard import MetricsTail, Progress, render, reward_failures, status, summary_line
from launch.report import summarize

RECORD = {
    "step": 3, "time_s": 1.5, "unix_time": 1.7e9, "step_wall_s": 0.5, "reward_mean": 0.25,
    "reward_std": 0.4, "frac_reward_zero_std": 0.0, "staleness_mean": 0.5, "staleness_max": 1,
    "staleness_hist": {"0": 2, "1": 2}, "tokens_per_s": 100.0, "learner_idle_frac": 0.2,
    "wait_s": 0.1, "publish_submit_s": 0.01, "snapshot_write_s": 0.02,
    "num_completion_tokens": 50, "groups_trained": 12, "groups_dropped_stale": 1,
    "groups_dropped_zero_variance": 2, "groups_rejected_invalid": 0, "groups_expired": 0,
    "leases_open": 4, "rejected_messages": 0,
    "producers": {"p1": {"version": 2, "state": "idle"}, "p2": {"version": 3, "state": "idle"}},
    "producer_counters": {"p1": {"reward_errors": 5, "reward_timeouts": 1, "groups_sent": 9},
                          "p2": {"reward_errors": 2, "groups_sent": 7}},
}  # fmt: skip


def _run_dir(tmp_path, records=(RECORD,)):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RF.CONFIG).write_text("[run]\nsteps = 50\n")
    (run_dir / RF.METRICS).write_text("".join(json.dumps(r) + "\n" for r in records))
    balance = RF.Balance(issued=20, trained=12, dropped_stale=1, open=4, ok=True)
    RF.write_ledger(run_dir, RF.Ledger(
        balance=balance, counters={"rejected.wrong_key": 3, "messages": 40},
    ))  # fmt: skip
    return run_dir


def test_reward_failures_are_summed_over_producers_and_shown_in_the_progress_line(tmp_path):
    rec = M.StepRecord.from_json(RECORD)  # a run older than producers.json: from its line
    views = RF.latest_producers(tmp_path, rec)
    assert reward_failures(views) == (7, 1)
    assert summary_line(rec, 50, 12.0, views=views).endswith("reward errors 7 timeouts 1")
    quiet = M.StepRecord.from_json({**RECORD, "producer_counters": {"p1": {}}})
    line = summary_line(quiet, 50, 1.0, views=RF.latest_producers(tmp_path, quiet))
    assert "reward" not in line.split("reward 0.250")[1]


def test_a_run_with_producers_json_is_read_from_it_not_from_its_metrics_lines(tmp_path):
    """A metrics line holds aggregates only; each producer's view is in producers.json."""
    new = {k: v for k, v in RECORD.items() if k not in ("producers", "producer_counters")}
    run_dir = _run_dir(tmp_path, [{**new, "producers_live": 1, "producers_by_state": {"idle": 1}}])
    view = RF.ProducerStatus(
        host="h", pid=1, engine="fake", version=4, state="generating", num_in_flight=2,
        counters={"reward_errors": 3, "groups_sent": 11},
    )  # fmt: skip
    RF.write_producers(run_dir, RF.ProducersFile(unix_time=1.0, producers={"q": view}))
    text = status(run_dir)
    assert "producer q: weights v4 generating, groups sent 11, reward errors 3 timeouts 0" in text
    assert "producer p1" not in text
    assert "errors 3, timeouts 0" in summarize(run_dir)
    assert "the producers' logs give the exceptions" in summarize(run_dir)
    first = "reward 'r' raised KeyError: 'score' (r.py, line 8: raise KeyError(\"score\"))"
    signal = RS.Signal(groups=9, with_signal=9, streak=0, streak_s=0.0, why="", first_error=first)
    RS.write_signal(run_dir, signal)
    assert f"(errors/timeouts per producer: q 3/0; the first: {first})" in summarize(run_dir)


def test_before_the_first_step_the_line_says_what_the_ledger_saw():
    line = summary_line(None, 50, 3.0, RF.Balance(issued=8, dropped_zero_variance=6, ok=True))
    assert "waiting for the first step… ledger dropped_zero_variance 6 issued 8 — " in line
    assert "no signal: all 6 groups had equal rewards for every completion" in line


def test_the_dashboard_shows_reward_failures(tmp_path):
    from rich.console import Console

    tail = MetricsTail(_run_dir(tmp_path) / RF.METRICS)
    tail.poll()
    console = Console(record=True, width=120)
    console.print(render(tail, steps=50, elapsed_s=3.0, restarts={}))
    assert "errors 7 · timeouts 1" in console.export_text()


def test_status_and_the_report_summary_tell_where_a_run_stands(tmp_path):
    run_dir = _run_dir(tmp_path)
    text = status(run_dir)
    assert "not finished" in text
    assert "step 3/50" in text
    assert "refused messages: rejected.wrong_key 3" in text
    assert "producer p1: weights v2 idle, groups sent 9, reward errors 5 timeouts 1" in text
    assert text.endswith(f"asyncgrpo report {run_dir}")
    result = CliRunner().invoke(app, ["status", str(run_dir)])
    assert result.exit_code == 0
    assert result.output.strip() == text
    summary = summarize(run_dir)
    assert "- reward failures (scored 0): errors 7, timeouts 1 (errors/timeouts per producer: " \
        "p1 5/1, p2 2/0;" in summary  # fmt: skip


def test_a_consumer_run_by_hand_logs_progress_lines(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logging.getLogger("asyncgrpo.progress"), "disabled", False)
    run_dir = _run_dir(tmp_path)
    progress = Progress(run_dir, 50, every_s=0.01)
    with caplog.at_level(logging.INFO, logger="asyncgrpo.progress"):
        progress.start()
        deadline = 2000
        while not caplog.records and deadline:
            progress._stop.wait(0.01)
            deadline -= 1
        progress.stop()
    assert "step 3/50 reward 0.250" in caplog.records[0].getMessage()


def test_status_tells_a_running_run_from_one_whose_consumer_is_gone(tmp_path):
    """consumer.json names a live process (this test's own): running; a process that has exited
    (a real one, waited for): stopped without finishing, with the command that continues it."""
    import os
    import socket
    import subprocess
    import sys
    import time

    from launch.dashboard import run_state

    run_dir = _run_dir(tmp_path)
    host = socket.gethostname()
    assert run_state(run_dir).startswith("not finished, and no consumer has listened for it")
    RS.write_consumer(run_dir, RS.ConsumerProcess(host=host, pid=os.getpid(), started=time.time()))
    assert run_state(run_dir) == f"running (consumer pid {os.getpid()})"
    assert f"run {run_dir}: running" in status(run_dir)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    RS.write_consumer(run_dir, RS.ConsumerProcess(host=host, pid=dead.pid, started=time.time()))
    said = run_state(run_dir)
    assert said.startswith(f"stopped without finishing (its consumer, pid {dead.pid}, is gone")
    assert said.endswith(f"`asyncgrpo launch --run-dir {run_dir} --resume` continues it")
    old = RS.ConsumerProcess(host=host, pid=os.getpid(), started=time.time() - 3600 * 24 * 365)
    RS.write_consumer(run_dir, old)  # our pid, but a process that began after that consumer
    assert run_state(run_dir).startswith("stopped without finishing")
    snap_final = run_dir / RF.FINAL
    snap_final.write_text('{"version": 3}')
    assert run_state(run_dir) == "finished"


SIGNAL = RS.Signal(
    groups=312,
    with_signal=0,
    streak=312,
    streak_s=24.4,
    why="reward calls failed in every group (first: reward 'b:f' raised IndexError: x); "
    "a failed call scores 0",
    max_groups=2000,
    max_s=300.0,
)


def test_before_the_first_step_the_line_says_what_arrives_and_why_none_has_a_signal():
    line = summary_line(
        None, 50, 26.0, RF.Balance(issued=40, dropped_zero_variance=30), signal=SIGNAL
    )
    assert line.startswith("[    26s] waiting for the first step… ledger ")
    assert (
        "— 312 groups arrived, 0 with a signal — no signal in the last 312 groups (24 s): " in line
    )
    assert (
        "raised IndexError: x); a failed call scores 0; the run stops after 1688 more such "
        "groups or in 276 s (run.no_signal_groups, run.no_signal_s)" in line
    )
    assert "no signal: all" not in line  # the watch says it once, not the ledger again


def test_before_any_group_the_line_says_what_the_producers_are_doing():
    views = {"p1": RF.ProducerStatus(version=-1, state="starting")}
    line = summary_line(None, 50, 8.0, RF.Balance(issued=4), views)
    assert line.endswith(
        "waiting for the first step… ledger issued 4 no group yet; producers: p1 starting"
    )
    assert summary_line(None, 50, 2.0).endswith("no group yet; no producer registered yet")


def test_once_steps_run_a_long_streak_without_signal_is_still_said(tmp_path):
    rec = M.StepRecord(**RECORD)
    short = RS.Signal(groups=50, with_signal=40, streak=5, streak_s=1.0, why="every completion…")
    assert "no signal in the last" not in summary_line(rec, 50, 3.0, signal=short)
    long = RS.Signal(groups=90, with_signal=40, streak=50, streak_s=9.0, why="every completion…")
    assert "— no signal in the last 50 groups (9 s): every completion…" in summary_line(
        rec, 50, 3.0, signal=long
    )
    stopped = RS.Signal(groups=90, with_signal=0, streak=90, streak_s=9.0, why="w", stopped=True)
    assert summary_line(None, 50, 3.0, signal=stopped).endswith(
        "— stopped: no learning signal in 90 groups in a row: w"
    )


def test_the_dashboard_and_status_show_the_signal_watch(tmp_path):
    from rich.console import Console

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RF.CONFIG).write_text("[run]\nsteps = 50\n")
    RS.write_signal(run_dir, SIGNAL)
    tail = MetricsTail(run_dir / RF.METRICS)
    console = Console(record=True, width=400)
    console.print(render(tail, steps=50, elapsed_s=3.0, restarts={}))
    assert "312 groups arrived, 0 with a signal" in console.export_text()
    assert "raised IndexError: x" in status(run_dir)


def test_a_plain_line_is_due_every_10_s_at_the_first_step_and_at_each_tenth():
    from common.progress import Ticker

    clock = Ticker(300, started=0.0)
    ticks = [(1, 0), (2, 1), (3, 2), (4, 29), (5, 30), (6, 31), (15.9, 40), (16, 59), (16.5, 60)]
    ticks += [(26.4, 61), (26.5, 61)]
    said = [t for t, step in ticks if clock.due(step, t)]
    # the first step, step 30 (a tenth), 10 s later, step 60, 10 s later
    assert said == [2, 5, 15.9, 16.5, 26.5]
    assert Ticker(0, started=0.0).due(500, 9.0) is True  # the first step, with no step limit
    unlimited = Ticker(0, started=0.0)
    unlimited.due(1, 1.0)
    assert not unlimited.due(900, 10.9)
    assert unlimited.due(900, 11.0)


def test_status_says_how_a_run_that_wrote_final_json_ended(tmp_path):
    from common.weights import snapshot as snap
    from launch.dashboard import run_state

    run_dir = _run_dir(tmp_path)
    snap.write_final(run_dir, 50, ended="steps")
    assert run_state(run_dir) == "finished"
    snap.write_final(run_dir, 7, ended="data")
    assert run_state(run_dir) == "finished at step 7: its prompts ran out (task.epochs)"
    snap.write_final(run_dir, 12, ended="stopped")
    assert run_state(run_dir) == (
        f"stopped at step 12 by Ctrl-C or SIGTERM; `asyncgrpo launch --run-dir {run_dir} "
        "--resume` continues it"
    )
    snap.write_final(run_dir, 0, ended="stopped")
    assert run_state(run_dir).startswith("stopped before its first step by Ctrl-C")
    snap.write_final(run_dir, 0, ended="no_signal", reason="no learning signal in 2000 groups")
    assert run_state(run_dir) == "stopped before its first step: no learning signal in 2000 groups"
    assert "**stopped before its first step: no learning signal in 2000 groups**" in summarize(
        run_dir
    )


def test_the_ledger_is_shown_as_counts_and_whether_they_balance_never_as_an_ok_flag(tmp_path):
    from launch.dashboard import ledger_text

    run_dir = _run_dir(tmp_path)
    text = status(run_dir)
    assert (
        "ledger: issued 20 trained 12 dropped_stale 1 dropped_zero_variance 0 "
        "rejected_invalid 0 expired 0 open 4 (balanced)" in text
    )
    assert " ok " not in text
    assert "ok" not in summarize(run_dir).split("## Ledger")[1].split("##")[0]
    assert ledger_text(RF.Balance(issued=1, ok=False)).endswith(
        "(DOES NOT BALANCE: a bug; please report)"
    )


def test_status_and_summary_count_the_first_step_from_the_consumers_start(tmp_path):
    import socket

    from launch.dashboard import run_clock

    run_dir = _run_dir(tmp_path)
    rec = M.StepRecord(**RECORD)
    assert run_clock(run_dir, rec) == 1.5  # no consumer.json: the learner's own clock
    began = RECORD["unix_time"] - 26.0
    RS.write_consumer(
        run_dir,
        RS.ConsumerProcess(host=socket.gethostname(), pid=1, started=began + 20, began=began),
    )
    assert run_clock(run_dir, rec) == 26.0
    assert "[    26s] step 3/50" in status(run_dir)
    assert (
        "- first step 26.0 s after the consumer started (1.5 s after its first group "
        "arrived)" in summarize(run_dir)
    )


def test_the_launchers_last_plain_line_is_not_said_twice(tmp_path, capsys):
    from launch import local

    run_dir = _run_dir(tmp_path)

    class Finished:  # a Supervisor whose run has already written its last step (3)
        consumer, failure = None, None

        def __init__(self):
            self.run_dir, self.producers = run_dir, []

        def start(self):
            return None

        def tick(self):
            return 0

        def stop(self):
            return 0

    code = local.run(Finished(), steps=3, live=False)  # type: ignore[arg-type]
    assert code == 0
    said = capsys.readouterr().err
    assert said.count("step 3/3") == 1, said

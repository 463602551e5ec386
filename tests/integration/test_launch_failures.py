"""What cannot succeed is not restarted: a reward module that does not import, a missing data
file, a model that does not load end `launch` (and a consumer started by hand) with one line
and exit code 2, no supervisor restart, no traceback, no final evaluation, and no run directory
left behind (launch/local.py `Supervisor.failure`, launch/cli/finish.py)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from procs import cli
from typer.testing import CliRunner

from common.errors import EXIT_CONFIG
from launch.cli import app
from launch.local import Child, Supervisor, last_error


def _child(tmp_path: Path, name: str, code: str) -> Child:
    return Child(name, [sys.executable, "-c", code], tmp_path / f"{name}.log")


def _tick_until(sup: Supervisor, done, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the supervisor did not get there"
        sup.tick()
        time.sleep(0.05)


def test_a_producer_with_a_configuration_error_is_not_restarted_and_fails_the_run(tmp_path):
    sup = Supervisor(tmp_path, config_path=tmp_path / "config.toml", num_producers=2)
    sup.consumer = _child(tmp_path, "consumer", "import time; time.sleep(60)")
    broken = "print('loading'); print('error: rewards.fns: cannot import x'); raise SystemExit(2)"
    sup.producers = [_child(tmp_path, "p1", broken), _child(tmp_path, "p2", "raise SystemExit(3)")]
    for child in [sup.consumer, *sup.producers]:
        child.start()
    try:
        _tick_until(sup, lambda: sup.failure is not None and sup.producers[1].restarts >= 1)
        assert str(sup.failure) == "producer p1 exited with 2: rewards.fns: cannot import x"
        assert sup.producers[0].restarts == 0  # exit 2: no restart can fix it
        assert sup.producers[0].finished
        assert sup.producers[1].restarts >= 1  # exit 3 (consumer lost): restarted
    finally:
        sup.stop(grace_s=5)


def test_the_last_error_line_is_what_a_child_said_last_with_error():
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "c.log"
        log.write_text("INFO start\nerror: first\nTraceback...\nerror: the one\nbye\n")
        assert last_error(log) == "the one"
        log.write_text("INFO start\nRuntimeError: boom\n\n")
        assert last_error(log) == "RuntimeError: boom"
        assert last_error(Path(d) / "none.log") == ""


def test_launch_with_a_reward_that_does_not_import_stops_before_anything_starts(tmp_path):
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        ["launch", "--run-dir", str(run_dir), "--set", 'rewards.fns=[{fn="no_such_mod:f"}]'],
    )
    assert result.exit_code == EXIT_CONFIG
    assert result.stderr.startswith("error: rewards.fns: cannot import 'no_such_mod:f'")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not run_dir.exists()


@pytest.mark.slow
def test_launch_with_a_missing_data_file_says_it_in_one_line_and_leaves_no_run(
    tmp_path, tiny_model_dir
):
    run_dir = tmp_path / "run"
    launcher = cli(
        "launch",
        "--run-dir",
        str(run_dir),
        "--model",
        str(tiny_model_dir),
        "--no-live",
        "--set",
        "task.source=jsonl",
        "--set",
        f"task.path={tmp_path / 'nothere.jsonl'}",
        log=tmp_path / "launch.log",
    )
    assert launcher.wait(120) == EXIT_CONFIG
    said = (tmp_path / "launch.log").read_text()
    assert "error: consumer exited with 2: task.path = " in said
    assert "nothere.jsonl': [Errno 2] No such file or directory" in said
    assert "Traceback" not in said
    assert f"model: {tiny_model_dir}\n" in said  # no "building it the first time": not the demo
    assert "first time" not in said
    assert "evaluating" not in said  # no final evaluation of a run that never started
    assert f"removed {run_dir}: the run never started" in said
    assert not run_dir.exists()


@pytest.mark.slow
def test_a_consumer_by_hand_with_a_model_that_does_not_load_leaves_no_run(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')  # no weights, no tokenizer
    run_dir = tmp_path / "run"
    consumer = cli(
        "consumer", "--run-dir", str(run_dir), "--model", str(model), log=tmp_path / "consumer.log"
    )
    assert consumer.wait(120) == EXIT_CONFIG
    said = (tmp_path / "consumer.log").read_text()
    assert f"error: cannot load the model '{model}' (model.path): OSError: " in said
    assert "Traceback" not in said
    assert not run_dir.exists()


def test_a_model_that_does_not_load_is_a_one_line_configuration_error(tmp_path):
    from common import config as C
    from common.errors import ConfigError
    from consumer.model_checks import load_trainer

    (tmp_path / "config.json").write_text('{"model_type": "llama"}')  # no weights
    with pytest.raises(ConfigError) as info:
        load_trainer(C.Config(), tmp_path)
    assert str(info.value).startswith(f"cannot load the model '{tmp_path}' (model.path): OSError: ")
    assert "\n" not in str(info.value)


def test_a_failed_start_removes_only_a_directory_it_created_and_never_trained_in(tmp_path):
    from launch.cli.app import NewRunDir, discard_failed_start

    fresh = tmp_path / "fresh"
    (fresh / "snapshots").mkdir(parents=True)
    (fresh / "consumer.log").write_text("error: x\n")
    assert discard_failed_start(NewRunDir(fresh, created=True))
    assert not fresh.exists()
    given = tmp_path / "given"  # the user's own directory: kept
    given.mkdir()
    assert not discard_failed_start(NewRunDir(given, created=False))
    assert given.exists()
    trained = tmp_path / "trained"
    trained.mkdir()
    (trained / "metrics.jsonl").write_text('{"step": 1}\n')
    assert not discard_failed_start(NewRunDir(trained, created=True))
    assert trained.exists()

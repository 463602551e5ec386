"""A run directory that holds another run is refused unless --resume or --force: two runs are
never mixed (appended metrics and leases, overwritten snapshots)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from common import config as C
from common.errors import ConfigError
from common.files import run_files as RF
from launch.cli import app
from launch.run_dir import claim, previous_run


def _used(run_dir):
    (run_dir / "snapshots" / "v000000").mkdir(parents=True)
    (run_dir / RF.METRICS).write_text('{"step": 1}\n')
    (run_dir / "consumer.log").write_text("old\n")
    (run_dir / "config.toml").write_text("")
    (run_dir / "notes.txt").write_text("mine\n")
    return run_dir


def test_a_new_or_configured_directory_is_taken(tmp_path):
    assert claim(tmp_path / "new", resume=False, force=False).is_dir()
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.toml").write_text("")  # what the launcher writes first
    (tmp_path / "cfg" / "consumer.log").write_text("")  # a consumer that failed at start-up
    assert previous_run(tmp_path / "cfg") == []
    claim(tmp_path / "cfg", resume=False, force=False)


def test_a_directory_holding_a_run_is_refused_naming_both_ways_out(tmp_path):
    run_dir = _used(tmp_path / "run")
    with pytest.raises(ConfigError) as err:
        claim(run_dir, resume=False, force=False)
    msg = str(err.value)
    assert "already holds a run (metrics.jsonl, snapshots)" in msg
    assert "--resume" in msg
    assert "--force" in msg
    assert (run_dir / RF.METRICS).exists()  # nothing touched
    claim(run_dir, resume=True, force=False)  # --resume continues it, untouched
    assert (run_dir / RF.METRICS).exists()


def test_force_removes_the_previous_runs_files_and_nothing_else(tmp_path):
    run_dir = _used(tmp_path / "run")
    (run_dir / RF.STREAM).mkdir()  # a new run must not append to this one's stream
    (run_dir / RF.STREAM / "000000.seg").write_bytes(b"old")
    claim(run_dir, resume=False, force=True)
    assert sorted(p.name for p in run_dir.iterdir()) == ["config.toml", "notes.txt"]


def test_resume_and_force_together_or_a_missing_resume_dir_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="pass one of them"):
        claim(tmp_path, resume=True, force=True)
    with pytest.raises(ConfigError, match="does not exist"):
        claim(tmp_path / "nope", resume=True, force=False)


def test_the_consumer_command_refuses_a_used_run_directory_in_one_line(tmp_path):
    run_dir = _used(tmp_path / "run")
    result = CliRunner().invoke(app, ["consumer", "--run-dir", str(run_dir), "--model", "x"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: ")
    assert "--resume" in lines[0]
    assert "--force" in lines[0]


def test_a_prepared_consumer_takes_the_run_as_the_launcher_wrote_it(tmp_path, monkeypatch):
    """`launch` claimed the directory, resolved the model and wrote config.toml; the consumer it
    starts (`--prepared`) neither claims the directory again nor resolves or rewrites."""
    import consumer.learner
    from launch.cli import run

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / RF.METRICS).write_text("")  # a second claim would call this another run
    cfg = C.override(
        C.Config(), {"run.dir": run_dir, "model.path": str(tmp_path / "nowhere"), "run.steps": 3}
    )
    config = run_dir / "config.toml"
    config.write_text("# as the launcher wrote it\n" + C.to_toml(cfg))
    learned = []
    monkeypatch.setattr(consumer.learner, "main", lambda c, out: learned.append((c, out)) or 0)
    monkeypatch.setattr(run, "setup_logging", lambda *args: None)
    result = CliRunner().invoke(app, ["consumer", "--config", str(config), "--prepared"])
    assert result.exit_code == 0, result.output
    assert learned == [(cfg, run_dir)]
    assert config.read_text().startswith("# as the launcher wrote it")
    unprepared = CliRunner().invoke(app, ["consumer", "--config", str(config)])
    assert unprepared.exit_code == 2
    assert "already holds a run" in unprepared.output
    assert learned == [(cfg, run_dir)]


@pytest.mark.parametrize("command", ["launch", "consumer"])
def test_a_start_that_fails_leaves_no_empty_run_directory(tmp_path, command):
    """A model that is not there fails the run's preparation: the directory made for the run
    goes again; one that was there before (the user's own) stays."""
    args = ["--model", str(tmp_path / "no-such-model"), "--set", "task.source=synthetic"]
    fresh = tmp_path / "runs" / "new"
    failed = CliRunner().invoke(app, [command, "--run-dir", str(fresh), *args])
    assert failed.exit_code == 2, failed.output
    assert "no-such-model" in failed.output
    assert not fresh.exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    assert CliRunner().invoke(app, [command, "--run-dir", str(mine), *args]).exit_code == 2
    assert mine.is_dir()


def test_a_command_without_resume_does_not_offer_it(tmp_path):
    run_dir = _used(tmp_path / "run")
    with pytest.raises(ConfigError) as err:
        claim(run_dir, resume=False, force=False, resumable=False)
    assert "--resume" not in str(err.value)
    assert "--force" in str(err.value)


def test_a_replay_into_a_directory_holding_a_run_offers_force_not_resume(tmp_path, tiny_model_dir):
    from replay_streams import config, record

    source = tmp_path / "source"
    source.mkdir()
    C.write(config(tiny_model_dir, source), source / RF.CONFIG)
    record(source)
    used = _used(tmp_path / "used")
    refused = CliRunner().invoke(app, ["replay", str(source), "--run-dir", str(used)])
    assert refused.exit_code == 2, refused.output
    assert "already holds a run" in refused.output
    assert "--resume" not in refused.output
    assert (used / RF.METRICS).exists()  # nothing touched

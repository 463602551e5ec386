"""Command-line flags reach the config as typed values: a path with quotes and backslashes
arrives exactly as typed, in the consumer/launch flags and in every stress setting."""

from __future__ import annotations

from pathlib import Path

from common import config as C
from launch.cli import load_config
from launch.stress.plan import IS_MODES, Scenario, build_config, is_overrides

QUOTED = 'runs/it\'s "quoted" \\ dir'


def test_flags_with_quotes_and_backslashes_arrive_as_typed():
    cfg = load_config(None, ["run.steps=5"], {"run.dir": QUOTED, "net.keys_dir": Path(QUOTED)})
    assert cfg.run.dir == QUOTED
    assert cfg.net.keys_dir == str(Path.cwd() / QUOTED)  # a path on the command line: from here
    assert cfg.run.steps == 5


def test_a_flag_not_given_leaves_the_set_value():
    cfg = load_config(None, ["run.steps=5"], {"run.steps": None})
    assert cfg.run.steps == 5


def test_a_stress_setting_keeps_a_quoted_run_directory(tmp_path):
    run_dir = tmp_path / 'sweep "a" \\ b' / "ms0-p2-off"
    cfg = build_config(
        C.Config(), ms=0, is_mode="off", engine="fake", steps=3, sc=Scenario(), run_dir=run_dir
    )
    C.validate(cfg)
    assert cfg.run.dir == str(run_dir)
    assert (cfg.loss.tis, cfg.producer.engine, cfg.run.steps) == (False, "fake", 3)


def test_every_importance_correction_mode_maps_to_config_modes():
    assert IS_MODES == (
        "off", "token-truncate", "token-mask", "sequence-truncate", "sequence-mask",
    )  # fmt: skip
    for mode in IS_MODES[1:]:
        cfg = C.override(C.Config(), is_overrides(mode))
        assert f"{cfg.loss.tis_level}-{cfg.loss.tis_mode}" == mode


def test_asyncgrpo_version_prints_the_installed_version():
    from importlib.metadata import version

    from typer.testing import CliRunner

    from launch.cli import app

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"asyncgrpo {version('asyncgrpo')}\n"

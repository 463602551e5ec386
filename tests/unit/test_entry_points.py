"""Entry points stay small: options that only set a config key are `--set`'s job, and the local
launcher's `run` takes what it supervises and how its lines read as two objects."""

from __future__ import annotations

import inspect

import typer

from launch import local
from launch.cli import app

MAX_STRESS_OPTIONS = 24  # 28 before the fake engine's six timing knobs went to --set; +1
# --variant: a dimension of the sweep (like --is: each setting gets one), not one config key;
# +1 --env: with --engine demo it picks the multi-turn demo's config, not only episodes.env


def test_stress_has_no_option_that_only_sets_a_config_key():
    command = typer.main.get_command(app).commands["stress"]  # type: ignore[attr-defined]
    names = {p.name for p in command.params}
    assert len(names) <= MAX_STRESS_OPTIONS, sorted(names)
    assert not names & {
        "gen_s",
        "step_s",
        "jitter",
        "long_tail",
        "publish_delay_s",
        "max_in_flight",
    }


def test_the_local_launchers_run_takes_a_supervisor_and_its_wording():
    params = inspect.signature(local.run).parameters
    assert list(params)[:1] == ["sup"]
    assert "wording" in params
    assert len(params) <= 7
    assert {f for f in local.Wording.__dataclass_fields__} == {"label", "beyond", "again"}

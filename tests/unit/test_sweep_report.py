"""`asyncgrpo report` and `status` on a stress sweep's directory: the sweep's own summary and
plots, never a run's (and no empty plot for a run with nothing to show)."""

from __future__ import annotations

from sweep_rows import row, sweep_dir
from typer.testing import CliRunner

from common.files import run_files as RF
from launch.cli import app

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# -- report and status on a sweep -----------------------------------------------------------------
def test_report_on_a_sweep_writes_the_sweeps_own_summary_again_and_no_run_plots(tmp_path):
    out = sweep_dir(tmp_path, [row(0, 0, 1000.0), row(2, 0, 1800.0)])
    before = (out / "summary.md").read_text()
    (out / "summary.md").write_text("lost")  # what `report` is for: writing it again
    result = CliRunner().invoke(app, ["report", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "summary.md").read_text() == before
    assert before.startswith("# Staleness sweep")
    assert not (out / "plots" / "staleness.png").exists()  # a run's plot, not a sweep's
    assert (out / "plots" / "throughput_vs_staleness.png").read_bytes()[:8] == PNG_MAGIC
    assert f"wrote {out / 'summary.md'}" in result.output


def test_status_on_a_sweep_says_it_is_one_and_where_its_runs_are(tmp_path):
    out = sweep_dir(tmp_path, [row(0, 0, 1000.0)])
    result = CliRunner().invoke(app, ["status", str(out)])
    assert result.exit_code == 2
    assert "is a stress sweep, not one run" in result.output
    assert f"asyncgrpo status {out}/runs/SETTING" in result.output


def test_report_refuses_a_directory_that_holds_no_run_and_writes_nothing(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "is not a run directory" in result.output
    assert list(tmp_path.iterdir()) == []


def test_a_run_with_no_trained_group_yet_gets_no_empty_staleness_plot(tmp_path):
    (tmp_path / RF.CONFIG).write_text("[run]\nsteps = 5\n")
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / RF.PLOTS / "staleness.png").exists()
    assert (tmp_path / RF.SUMMARY).exists()

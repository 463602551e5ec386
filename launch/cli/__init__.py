"""`asyncgrpo`: the command-line entry point (typer).

The flags people type live here; every other setting is a config key (TOML file via --config,
one-offs via --set section.key=value; `asyncgrpo config show` lists them all with their help).
Heavy imports (torch, transformers, vllm) happen inside command bodies, so `--help` is instant
and fake-engine producers never import torch.

One module per command family, all registered below on the one app (launch/cli/app.py: the
app, the shared options and helpers):
- run.py: `launch`, `consumer`, `producer` (the processes of a run; the run prepared once);
  dry_run.py: what `launch --dry-run` prints (a run's first prompts sampled and scored);
  finish.py: after a launch's run (how it ended, the final evaluation, the report);
- stress.py: `stress` (launch/stress/ runs the sweep);
- replay.py: `replay` (consumer/replay.py trains on a recorded stream);
- status.py: `status`, `report`;
- model.py: `make-model`, `eval`, `export` (launch/export.py);
- keys.py: `keys`;
- config.py: `config show`, `config docs`.
`python -m launch.cli` (launch/cli/__main__.py) and the `asyncgrpo` console script both run
`main`.
"""

from __future__ import annotations

import os

from launch.cli import config, keys, model, replay, run, status, stress
from launch.cli.app import DEMO_CONFIG, app, load_config, load_given

# The commands, in the order `asyncgrpo --help` lists them.
app.command(epilog=run.CONSUMER_EPILOG)(run.consumer)
app.command(epilog=run.PRODUCER_EPILOG)(run.producer)
app.command(help=keys.HELP, epilog=keys.EPILOG)(keys.keys)
app.command()(run.launch)
app.command(epilog=replay.EPILOG)(replay.replay)
app.command()(status.report)
app.command()(status.status)
app.command(epilog=stress.EPILOG)(stress.stress)
app.command("make-model")(model.make_model)
app.command("eval")(model.eval_)
app.command("export", epilog=model.EXPORT_EPILOG)(model.export)
app.add_typer(config.config_app, name="config")

__all__ = ["DEMO_CONFIG", "app", "load_config", "load_given", "main"]


def main() -> None:
    # transformers' per-file progress bars ("Loading weights", "Writing model shards") would
    # interleave with our own progress display; children inherit the setting.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    app()

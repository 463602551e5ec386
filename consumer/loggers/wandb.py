"""Weights & Biases (pip extra `wandb`). The run's id is kept in RUN/wandb_id.txt, so the run
continues the same W&B run after `--resume`; its local files go under RUN/wandb/. WANDB_MODE
(`offline`, `disabled`), WANDB_PROJECT, WANDB_ENTITY and the other WANDB_* variables apply as
W&B documents them. Every metric is logged with `policy_version` beside it, which
`define_metric` makes the x axis of every chart: a resumed run logs versions it logged before
without W&B's "step must increase" refusal. The config is logged once (at init); each
completions sample is a `wandb.Table`."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from common.files.completions_file import COLUMNS, CompletionRow

ID_FILE = "wandb_id.txt"
STEP = "policy_version"


class WandbSink:
    name = "wandb"

    def __init__(
        self, run_dir: Path, *, run_name: str, config: dict[str, Any], project: str
    ) -> None:
        import wandb

        id_path = run_dir / ID_FILE
        if id_path.exists():
            run_id = id_path.read_text().strip()
        else:
            run_id = uuid.uuid4().hex[:8]
            id_path.write_text(run_id + "\n")
        self.wandb = wandb
        self.run = wandb.init(
            project=project,
            name=run_name,
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=config,
            settings=wandb.Settings(console="off", quiet=True),
        )
        self.run.define_metric(STEP)
        self.run.define_metric("*", step_metric=STEP)

    def config(self, toml_text: str) -> None:
        del toml_text  # given to wandb.init

    def metrics(self, step: int, values: dict[str, float]) -> None:
        self.run.log({**values, STEP: step})

    def completions(self, step: int, rows: list[CompletionRow]) -> None:
        data = [[_cell(getattr(row, c)) for c in COLUMNS] for row in rows]
        self.run.log(
            {"completions": self.wandb.Table(columns=list(COLUMNS), data=data), STEP: step}
        )

    def flush(self) -> None:
        return None

    def close(self) -> None:
        """Finish the run and stop W&B's service process: its files are whole on disk only
        once the service has exited (seen under load: `finish` alone returned before it wrote
        the run's records)."""
        self.run.finish()
        self.wandb.teardown()


def _cell(value: Any) -> Any:
    """A table cell: the per-function rewards as JSON text (a table cell holds no dict)."""
    import json

    return json.dumps(value, sort_keys=True) if isinstance(value, dict) else value

"""TensorBoard: event files under RUN/tensorboard/ (torch's `SummaryWriter`; pip extra
`tensorboard`). Scalars under their namespaced names at step = policy version; the config and
each completions sample as text (Markdown), which TensorBoard's Text tab shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.completions_file import CompletionRow, markdown_table

DIR = "tensorboard"


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, run_dir: Path, *, run_name: str, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / DIR), flush_secs=10)
        del run_name, config  # the config goes in as text (`config`)

    def config(self, toml_text: str) -> None:
        self.writer.add_text("config", "```toml\n" + toml_text + "\n```", 0)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        for name, value in values.items():
            self.writer.add_scalar(name, value, step)

    def completions(self, step: int, rows: list[CompletionRow]) -> None:
        self.writer.add_text("completions", markdown_table(rows), step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

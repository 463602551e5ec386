"""TensorBoard: event files under RUN/tensorboard/ (pip extra `tensorboard`), written with
TensorBoard's own event-file writer. Each step is one event whose summary holds every scalar
under its namespaced name, at step = policy version; the config and each completions sample
are text (Markdown, tag NAME/text_summary), which TensorBoard's Text tab shows.

Not torch's `SummaryWriter`: it imports torch (2 s of CPU at start, in a child that training
shares its cores with) and writes one event per scalar (about 40 per step on the demo)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from common.files.completions_file import CompletionRow, markdown_table

DIR = "tensorboard"
FLUSH_S = 10


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, run_dir: Path, *, run_name: str, config: dict[str, Any]) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.writer = EventFileWriter(str(run_dir / DIR), flush_secs=FLUSH_S)
        del run_name, config  # the config goes in as text (`config`)

    def config(self, toml_text: str) -> None:
        self._text("config", "```toml\n" + toml_text + "\n```", 0)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        summary = Summary(
            value=[Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items()]
        )
        self._write(step, summary)

    def completions(self, step: int, rows: list[CompletionRow]) -> None:
        self._text("completions", markdown_table(rows), step)

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()

    def _text(self, tag: str, text: str, step: int) -> None:
        """A text summary as TensorBoard's text plugin reads it: a string tensor of shape [1]."""
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        from tensorboard.plugins.text.metadata import create_summary_metadata

        tensor = TensorProto(
            dtype="DT_STRING",
            string_val=[text.encode()],
            tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]),
        )
        meta = create_summary_metadata(display_name=tag, description="")
        value = Summary.Value(tag=f"{tag}/text_summary", metadata=meta, tensor=tensor)
        self._write(step, Summary(value=[value]))

    def _write(self, step: int, summary: Any) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))

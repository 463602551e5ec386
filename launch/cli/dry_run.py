"""`asyncgrpo launch --dry-run`: check a run's reward on its starting model before training.

A few of the run's first prompts are sampled G times each with the starting model and scored
by the run's rewards, as the producers would (consumer/evaluation/preflight.py); each completion
is printed with its reward and each function's own score, then a verdict: how many prompts
carry a learning signal (their rewards differ), how many reward calls failed and the first
failure's line, and prompts the tokenizer cannot read. Nothing is trained, no process is
started and no run directory is made. Exit code 0 when some prompt has a signal, 3
(`EXIT_NO_SIGNAL`, as a run that stops for it) when none has.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

from common import config as C
from common.errors import EXIT_NO_SIGNAL
from common.host.model_dir import DEMO_CHARS_HINT, is_demo_model

if TYPE_CHECKING:
    from consumer.evaluation.preflight import DryGroup

DRY_RUN_PROMPTS = 4
_SHOWN_CHARS = 60


def run_dry(cfg: C.Config) -> NoReturn:
    """`launch --dry-run`: resolve the model (the demo is built the first time), print the dry
    run, exit with its code."""
    from common.errors import ConfigError
    from launch.cli.app import fail, resolve_model

    if cfg.producer.engine == "fake":
        fail("--dry-run samples with the model: the fake engine has none (its rewards are coins)")
    try:
        code = show_dry_run(cfg, resolve_model(cfg.model.path))
    except ConfigError as exc:
        fail(str(exc))
    raise typer.Exit(code)


def show_dry_run(cfg: C.Config, model_dir: Path) -> int:
    """Print the dry run of `cfg` with the model in `model_dir`; its exit code."""
    from consumer import evaluation
    from producer.rewards.judge import HeldOutJudge

    names = ", ".join(r.fn for r in cfg.rewards.fns)
    G, temperature = cfg.sampling.group_size, cfg.sampling.temperature
    typer.echo(
        f"dry run: the first {DRY_RUN_PROMPTS} prompts of the task, {G} completions each, "
        f"sampled by {model_dir} at temperature {temperature:g} and scored by {names} "
        "(nothing is trained, no run directory is made)",
        err=True,
    )
    groups = evaluation.dry_run(cfg, model_dir, judge=HeldOutJudge, num_prompts=DRY_RUN_PROMPTS)
    hint = DEMO_CHARS_HINT if is_demo_model(model_dir) else ""
    for number, group in enumerate(groups, start=1):
        for line in group_lines(number, group, hint):
            typer.echo(line)
    return verdict(groups)


def group_lines(number: int, group: DryGroup, hint: str = "") -> list[str]:
    """One prompt's lines: the prompt and answer, a row per completion (reward, each function's
    score, the text), and whether its rewards carry a signal; `hint`: what the tokenizer knows,
    said when the prompt holds tokens it does not."""
    out = [f"prompt {number}: {_short(group.prompt)}  answer {_short(group.answer)}"]
    if group.unknown_tokens:
        out.append(
            f"  the tokenizer reads {group.unknown_tokens} of its tokens as its unknown token: "
            "the model cannot read them" + (f" ({hint})" if hint else "")
        )
    names = list(group.parts)
    out.append("  " + "  ".join(["reward", *names, "completion"]))
    for i, text in enumerate(group.completions):
        scores = [f"{group.parts[n][i]:>{len(n)}.3f}" for n in names]
        out.append("  " + "  ".join([f"{group.rewards[i]:>6.3f}", *scores, _short(text)]))
    if group.signal:
        out.append("  → the rewards differ: a learning signal")
    else:
        out.append(f"  → every completion scored {group.rewards[0]:g}: no signal from this prompt")
    return out


def verdict(groups: list[DryGroup]) -> int:
    """The closing lines (signal, failed reward calls, unreadable prompts); the exit code."""
    with_signal = sum(g.signal for g in groups)
    failed = sum(g.num_failed for g in groups)
    first = next((g.first_error for g in groups if g.first_error), "")
    if failed:
        typer.secho(
            f"reward calls failed: {failed} (scored 0; first: {first})",
            fg=typer.colors.YELLOW,
            err=True,
        )
    unreadable = sum(bool(g.unknown_tokens) for g in groups)
    if unreadable:
        typer.secho(
            f"{unreadable} of {len(groups)} prompts hold tokens the model's tokenizer does not "
            "know (docs/custom_task/README.md)",
            fg=typer.colors.YELLOW,
            err=True,
        )
    if with_signal:
        typer.secho(
            f"{with_signal} of {len(groups)} prompts have a learning signal (rewards that "
            "differ): training can learn from them",
            fg=typer.colors.GREEN,
            err=True,
        )
        return 0
    typer.secho(
        f"none of {len(groups)} prompts has a learning signal (every completion of each scored "
        "the same): a run would drop every such group; fix the reward, or use an easier task "
        "or a stronger model",
        fg=typer.colors.RED,
        err=True,
    )
    return EXIT_NO_SIGNAL


def _short(text: str) -> str:
    """`text` quoted, cut to a line's share."""
    shown = repr(text)
    return shown if len(shown) <= _SHOWN_CHARS else shown[: _SHOWN_CHARS - 4] + "...'"

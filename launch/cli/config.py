"""`asyncgrpo config show` and `asyncgrpo config docs`: every config key with its help
(common/config); `docs` is docs/config.md's reference table, which a test compares with it."""

from __future__ import annotations

import dataclasses

import typer

from common import config as C
from launch.cli.app import ConfigOpt, SetOpt, load_config

config_app = typer.Typer(help="Inspect the configuration keys.", no_args_is_help=True)


def _shown(v: object) -> str:
    """A default as the config table shows it (TOML syntax; dataclasses as inline tables)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_shown(x) for x in v) + "]"
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        fields = ", ".join(f"{k} = {_shown(x)}" for k, x in dataclasses.asdict(v).items())
        return "{" + fields + "}"
    return str(v)


@config_app.command("show")
def config_show(config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Print the resolved configuration as TOML, each key with its help as a comment."""
    cfg = load_config(config, set_, {})
    helps = {key: text for key, _, _, text in C.field_help()}
    section = ""
    for line in C.to_toml(cfg).splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif "=" in line and section:
            key = f"{section}.{line.split('=')[0].strip()}"
            if key in helps:
                typer.echo(f"# {helps[key]}")
        typer.echo(line)


@config_app.command("docs")
def config_docs() -> None:
    """Print the Markdown table of every config key (docs/config.md)."""
    typer.echo("| key | type | default | meaning |\n|---|---|---|---|")
    for key, tname, default, text in C.field_help():
        shown = _shown(default)
        typer.echo(f"| `{key}` | {tname} | `{shown}` | {text} |")

"""`asyncgrpo keys`: CurveZMQ keys for a run across machines (common/net/keys.py makes them)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from common.errors import ConfigError
from launch.cli.app import fail

# The help text is given at registration rather than as a docstring: it is one line in the
# command list.
HELP = (
    "Create CurveZMQ keys: the consumer's pair and one per producer host (run again to add "
    "hosts; existing keys are kept)."
)
EPILOG = (
    "`asyncgrpo keys keys/ --producer gpu1 --producer gpu2`, then: the consumer takes "
    "`--keys keys/` (server/ and the allowlist clients/ stay on its host); copy "
    "keys/producers/gpu1/ to host gpu1 only and start it with `--keys DIR`. Delete "
    "keys/clients/gpu1.key to revoke gpu1."
)


def keys(
    directory: Annotated[Path, typer.Argument(help="Directory to create the keys in.")],
    producer_names: Annotated[
        list[str] | None,
        typer.Option("--producer", "-p", help="A producer host's name (repeatable)."),
    ] = None,
) -> None:
    from common.net.keys import create_keys

    try:
        homes = create_keys(directory, producer_names or ["producer"])
    except ConfigError as exc:
        fail(str(exc))
    typer.echo(
        f"consumer host: --keys {directory}  (its secret: {directory}/server/; "
        f"allowlist: {directory}/clients/)"
    )
    for home in homes:
        typer.echo(f"producer host {home.name}: copy {home}/ there, then --keys <that copy>")

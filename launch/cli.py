"""`asyncgrpo`: the command-line entry point (typer).

The flags people type live here; every other setting is a config key (TOML file via --config,
one-offs via --set section.key=value; `asyncgrpo config show` lists them all with their help).
Heavy imports (torch, transformers, vllm) happen inside command bodies, so `--help` is instant
and fake-engine producers never import torch.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from common import config as C
from common.errors import ConfigError

app = typer.Typer(
    help=(
        "Asynchronous off-policy GRPO. A consumer (the learner) leases prompts to producers, which "
        "sample G completions per prompt, score them with verifiable rewards and stream the groups "
        "back over ZeroMQ; the learner trains with a TIS-corrected GRPO loss and publishes weight "
        "snapshots that producers reload. Start with `asyncgrpo launch` (the embedded demo)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the configuration keys.", no_args_is_help=True)
app.add_typer(config_app, name="config")

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="TOML config file (see `asyncgrpo config show`).")
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


def load_config(config: Path | None, sets: list[str] | None, flags: dict[str, object]) -> C.Config:
    """Defaults < TOML file < --set < explicit flags (None = not given); validated."""
    overrides = list(sets or [])
    overrides += [f"{k}={_toml_value(v)}" for k, v in flags.items() if v is not None]
    try:
        return C.load(config, overrides)
    except ConfigError as exc:
        _fail(str(exc))
        raise AssertionError from exc  # unreachable


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str | Path):
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(v)


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def setup_logging(run_dir: Path | None, name: str, verbose: bool = False) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if run_dir is not None:
        handlers.append(logging.FileHandler(run_dir / f"{name}.log"))
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s {name} %(levelname)s %(message)s",
        handlers=handlers,
        force=True,
    )


def make_run_dir(cfg: C.Config) -> Path:
    run_dir = Path(cfg.run.dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    if cfg.run.resume and not run_dir.is_dir():
        _fail(f"run.resume: {run_dir} does not exist (pass --run-dir of the run to resume)")
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


@app.command()
def consumer(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run_dir: Annotated[str | None, typer.Option("--run-dir", help="run.dir: where metrics, ledger and snapshots go.")] = None,
    steps: Annotated[int | None, typer.Option(help="run.steps: optimizer steps to take.")] = None,
    model: Annotated[str | None, typer.Option(help="model.path: HF model directory, or 'demo'.")] = None,
    max_staleness: Annotated[int | None, typer.Option(help="staleness.max_staleness (0 = synchronous).")] = None,
    bind: Annotated[str | None, typer.Option(help="net.bind_host: address to listen on.")] = None,
    port: Annotated[int | None, typer.Option(help="net.control_port: the port producers --connect to.")] = None,
    keys: KeysOpt = None,
    insecure: InsecureOpt = False,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the run directory's checkpoint.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run the learner: lease prompts, receive groups, train, publish snapshots."""
    flags = {
        "run.dir": run_dir, "run.steps": steps, "model.path": model,
        "staleness.max_staleness": max_staleness, "net.bind_host": bind, "net.control_port": port,
        "net.keys_dir": keys, "net.insecure": insecure or None, "run.resume": resume or None,
    }  # fmt: skip
    cfg = load_config(config, set_, flags)
    out = make_run_dir(cfg)
    cfg = C.apply_overrides(cfg, [f"run.dir={_toml_value(str(out))}"])
    C.write(cfg, out / "config.toml")
    setup_logging(out, "consumer", verbose)
    from consumer.learner import main as learner_main

    try:
        code = learner_main(cfg, out)
    except ConfigError as exc:
        _fail(str(exc))
    raise typer.Exit(code)


@app.command()
def producer(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    connect: Annotated[str | None, typer.Option(help="net.connect: the consumer's control endpoint, tcp://HOST:PORT.")] = None,
    engine: Annotated[str | None, typer.Option(help="producer.engine: hf, vllm or fake.")] = None,
    model: Annotated[str | None, typer.Option(help="producer.model: local model dir (default: the consumer's).")] = None,
    max_in_flight: Annotated[int | None, typer.Option(help="producer.max_in_flight: prompts held at once.")] = None,
    producer_id: Annotated[str | None, typer.Option("--id", help="producer.id: name in logs and ledger.")] = None,
    device: Annotated[str | None, typer.Option(help="producer.device for the hf engine.")] = None,
    keys: KeysOpt = None,
    insecure: InsecureOpt = False,
    log_file: Annotated[Path | None, typer.Option(help="Also log to this file.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run a producer: sample groups for the consumer's leases; reload its snapshots."""
    flags = {
        "net.connect": connect, "producer.engine": engine, "producer.model": model,
        "producer.max_in_flight": max_in_flight, "producer.id": producer_id,
        "producer.device": device, "net.keys_dir": keys, "net.insecure": insecure or None,
    }  # fmt: skip
    cfg = load_config(config, set_, flags)
    setup_logging(None, "producer", verbose)
    if log_file is not None:
        logging.getLogger().addHandler(logging.FileHandler(log_file))
    from producer.worker import main as worker_main

    try:
        code = asyncio.run(worker_main(cfg))
    except ConfigError as exc:
        _fail(str(exc))
    raise typer.Exit(code)


@app.command()
def keys(directory: Annotated[Path, typer.Argument(help="Directory to create the keys in.")]) -> None:
    """Create CurveZMQ keys: server.key(_secret) for the consumer, client.key(_secret) for producers."""
    from common.sockets import create_keys

    server, client = create_keys(directory)
    typer.echo(f"wrote {server} and {client} (+ secrets) in {directory}")
    typer.echo("consumer: --keys DIR (needs server.key_secret, client.key)")
    typer.echo("producers: --keys DIR (need client.key_secret, server.key)")


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
    """Print the Markdown table of every config key (the README's reference)."""
    typer.echo("| key | type | default | meaning |\n|---|---|---|---|")
    for key, tname, default, text in C.field_help():
        shown = repr(default) if not isinstance(default, list) else str(default)
        typer.echo(f"| `{key}` | {tname} | `{shown}` | {text} |")


def main() -> None:
    app()

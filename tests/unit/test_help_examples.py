"""Every example a command's `--help` shows (a quoted `asyncgrpo ...` in its help, its options'
help or its epilog) parses against the CLI, and the examples that set up or start a producer are
run: `asyncgrpo keys ...` for real in a scratch directory, then each `asyncgrpo producer ...`
up to the producer it would start (its keys loaded, its config checked), with no consumer to
connect to. The consumer's and the sweep's examples name a model or config of the reader's own
(/models/qwen, mine.toml), so they are parsed, not run.
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import zmq.asyncio
from docs_check import command_problems
from hints_check import QUOTED, commands
from typer.testing import CliRunner

from launch.cli import app


def help_examples() -> list[tuple[str, str]]:
    """(command, example) for every quoted `asyncgrpo ...` in a command's help texts."""
    out = []
    for name, cmd in commands().items():
        texts = [cmd.help, cmd.epilog, *(getattr(p, "help", None) for p in cmd.params)]
        out += [(name, e) for text in texts if text for e in QUOTED.findall(text)]
    return out


EXAMPLES = help_examples()
PRODUCER_EXAMPLES = [e for _, e in EXAMPLES if e.startswith("asyncgrpo producer ")]
KEYS_EXAMPLES = [e for _, e in EXAMPLES if e.startswith("asyncgrpo keys keys/ ")]


def test_there_are_examples_to_check() -> None:
    shown_by = {name for name, _ in EXAMPLES}
    assert {"consumer", "producer", "keys", "stress"} <= shown_by
    assert len(PRODUCER_EXAMPLES) >= 3
    assert KEYS_EXAMPLES


@pytest.mark.parametrize(("where", "example"), EXAMPLES, ids=[f"{w}: {e}" for w, e in EXAMPLES])
def test_every_help_example_parses(where: str, example: str) -> None:
    assert command_problems(example, mention="DIR" in example or "HOST" in example) == []


@pytest.mark.parametrize("example", PRODUCER_EXAMPLES)
def test_every_producer_example_starts_a_producer_with_the_keys_it_names(
    example: str, tmp_path, monkeypatch
) -> None:
    """Run as shown, after the keys example made keys/ (placeholders: HOST a loopback name, DIR
    the first producer's own keys): the producer is built, keys and all, and stops there."""
    import producer.main
    from producer.worker import Producer

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for keys_example in KEYS_EXAMPLES:
        made = runner.invoke(app, shlex.split(keys_example)[1:])
        assert made.exit_code == 0, made.output
    built: list[Producer] = []

    async def build_only(cfg: Any) -> int:
        ctx = zmq.asyncio.Context()
        try:
            built.append(Producer(cfg, ctx))
            built[-1].control.close()
        finally:
            ctx.destroy(linger=0)
        return 0

    monkeypatch.setattr(producer.main, "main", build_only)
    args = example.replace("HOST", "localhost").replace("DIR", "keys/producers/gpu1")
    started = runner.invoke(app, shlex.split(args)[1:])
    assert started.exit_code == 0, started.output
    assert len(built) == 1
    assert (built[0].keys is not None) == ("--keys" in args)


def test_a_producer_given_the_consumers_keys_directory_is_refused_with_the_way_out(
    tmp_path, monkeypatch
) -> None:
    """What the producer's example said before (`--keys keys/`): refused, naming its own."""
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    assert runner.invoke(app, ["keys", "keys/", "--producer", "gpu1"]).exit_code == 0
    refused = runner.invoke(
        app, ["producer", "--connect", "tcp://10.0.0.1:5555", "--keys", "keys/", "--engine", "fake"]
    )
    assert refused.exit_code == 2
    assert "give a producer its own" in refused.output

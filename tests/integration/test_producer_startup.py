"""A producer that cannot start says why in one `error:` line (exit 2), naming whose setting is
at fault: a reward module that fails to import, a model directory that is not there (the
consumer's announced model.path, or this producer's --model), a model that does not load, an
endpoint without tcp://. `--model demo` is the embedded demo model on the producer's host too.

A real consumer network thread (consumer/server/server.py) on loopback answers the registration, and
the producer command runs in this process (typer's runner)."""

from __future__ import annotations

import contextlib

import pytest
from served import started_server
from typer.testing import CliRunner

from common import config as C
from launch.cli import app


@pytest.fixture
def consumer_at(tmp_path):
    """A factory: a listening consumer network thread announcing `model` and `rewards`; its
    control endpoint."""
    with contextlib.ExitStack() as made:

        def start(model: str, reward: str = "exact_match") -> str:
            cfg = C.apply_overrides(
                C.Config(), ["net.control_port=0", f'rewards.fns=[{{fn="{reward}", weight=1.0}}]']
            )
            served = started_server(cfg, tmp_path, vocab_size=64, model=model)
            srv, _ = made.enter_context(served)
            return f"tcp://127.0.0.1:{srv.ports['control']}"

        yield start


def _producer(*args: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, ["producer", "--engine", "hf", *args])
    assert "Traceback" not in result.output, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error: ")]
    return result.exit_code, errors


def test_the_consumers_model_path_missing_on_this_host_is_blamed_on_the_consumer(consumer_at):
    code, errors = _producer("--connect", consumer_at("/models/only-on-the-learner"))
    assert code == 2
    assert len(errors) == 1
    assert "'/models/only-on-the-learner' (the consumer's model.path" in errors[0]
    assert "pass --model" in errors[0]


def test_this_producers_model_path_missing_is_blamed_on_this_producer(consumer_at, tmp_path):
    ep = consumer_at("/models/x")
    code, errors = _producer("--connect", ep, "--model", str(tmp_path / "nope"))
    assert code == 2
    assert "(this producer's producer.model (--model))" in errors[0]


def test_a_model_that_does_not_load_is_one_line(consumer_at, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    code, errors = _producer("--connect", consumer_at(str(broken)))
    assert code == 2
    assert errors[0].startswith(f"error: cannot load the model '{broken}' (the consumer's")


def test_a_reward_module_that_raises_at_import_is_one_line(
    consumer_at, tiny_model_dir, tmp_path, monkeypatch
):
    (tmp_path / "bad_reward_mod.py").write_text("1 / 0\n\ndef score(c, a):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    code, errors = _producer("--connect", consumer_at(str(tiny_model_dir), "bad_reward_mod:score"))
    assert code == 2
    assert errors == [
        "error: rewards.fns: importing 'bad_reward_mod:score' raised ZeroDivisionError: "
        "division by zero"
    ]
    code, errors = _producer("--connect", consumer_at(str(tiny_model_dir), "not_there_mod:score"))
    assert "the module must be importable there" in errors[0]


def test_a_connect_endpoint_without_tcp_is_one_line():
    code, errors = _producer("--connect", "127.0.0.1:5555")
    assert code == 2
    assert errors == [
        "error: net.connect = '127.0.0.1:5555': not an endpoint tcp://HOST:PORT "
        "(did you mean 'tcp://127.0.0.1:5555'?)"
    ]


def test_model_demo_is_the_demo_model_of_the_producers_host(monkeypatch, tiny_model_dir):
    import launch.demo_model
    import producer.main

    seen = {}

    async def fake_main(cfg):
        seen["model"] = cfg.producer.model
        return 0

    monkeypatch.setattr(launch.demo_model, "ensure_demo_model", lambda: tiny_model_dir)
    monkeypatch.setattr(producer.main, "main", fake_main)
    result = CliRunner().invoke(app, ["producer", "--model", "demo"])
    assert result.exit_code == 0, result.output
    assert seen["model"] == str(tiny_model_dir)


async def test_the_hf_engine_refuses_weights_of_another_shape_as_a_mismatch(
    tiny_model_dir, tmp_path
):
    from tiny_models import build_tiny_model

    from common.errors import SnapshotMismatch
    from producer.engines.hf import HFEngine

    other = build_tiny_model(tmp_path / "wide", hidden=32)
    engine = HFEngine(tiny_model_dir, device="cpu", seed=0)
    try:
        with pytest.raises(SnapshotMismatch, match="does not fit the model"):
            await engine.load_weights(other, 1)
        assert engine.version == -1  # its weights untouched
    finally:
        await engine.close()

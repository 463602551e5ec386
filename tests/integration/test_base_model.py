"""A producer on a host without the model: the consumer lists its model directory's files in the
run spec (consumer/snapshots/base_model.py) and serves exactly those on its data socket; the
producer fetches them once, each checked against its BLAKE3 digest (producer/base_model.py),
and builds its session on them. Real loopback sockets, the tiny model. The last two tests run
the producer as a process on another "host": its own directory and HOME, the consumer's
directory an empty tmpfs in its own mount namespace (root and unshare; skipped without)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import zmq
import zmq.asyncio
from ledger_invariant import assert_run_balanced
from procs import cli, endpoint, hiding_unavailable, read_jsonl, stop, wait_for
from served import started_server
from test_pipeline import consumer_args, write_prompts

from common import config as C
from common import wire
from common.errors import ConfigError
from common.files import run_files as RF
from consumer.server.wire_terms import run_spec
from consumer.snapshots.base_model import listing
from producer import base_model as B
from producer.session import open_session

CFG = C.override(C.Config(), {"net.control_port": 0, "snapshot.chunk_mib": 1 / 16})


def fetch(port: int, files: tuple[wire.ModelFile, ...], root: Path) -> Path:
    async def go() -> Path:
        ctx = zmq.asyncio.Context()
        try:
            return await B.fetch_model(
                ctx,
                files,
                data_endpoint=f"tcp://127.0.0.1:{port}",
                keys=None,
                max_message_bytes=64 << 20,
                root=root,
            )
        finally:
            ctx.destroy(linger=0)

    return asyncio.run(go())


def test_a_producer_without_the_model_fetches_the_consumers_files_once(
    tmp_path, tiny_model_dir, caplog
):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "notes.md").write_text("not a model file")  # not listed, never served
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with started_server(CFG, run_dir, model=str(model)) as (srv, _):
        files = srv.spec.model_files
        names = [f.name for f in files]
        assert "config.json" in names
        assert "model.safetensors" in names
        assert "notes.md" not in names
        caplog.set_level("INFO", logger="asyncgrpo.producer")
        got = fetch(srv.ports["data"], files, tmp_path / "cache")
        for f in files:  # the same bytes, in a directory of its own
            assert (got / f.name).read_bytes() == (model / f.name).read_bytes()
        assert sorted(p.name for p in got.iterdir()) == sorted(names)
        assert got.stat().st_mode & 0o777 == 0o755
        assert "fetching its" in caplog.text
        assert "fetching the model: " in caplog.text  # progress (common/progress.py)
        caplog.clear()
        assert fetch(srv.ports["data"], files, tmp_path / "cache") == got  # once: kept
        assert "fetching" not in caplog.text
        assert [p.name for p in (tmp_path / "cache").iterdir()] == [got.name]  # no leftovers


def test_a_file_that_does_not_match_its_digest_or_is_not_listed_is_refused(
    tmp_path, tiny_model_dir
):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with started_server(CFG, run_dir, model=str(tiny_model_dir)) as (srv, ctx):
        files = srv.spec.model_files
        wrong = tuple(
            wire.ModelFile(f.name, f.num_bytes, "0" * 64) if f.name == "config.json" else f
            for f in files
        )
        with pytest.raises(ConfigError, match=r"model file config\.json fetched does not match"):
            fetch(srv.ports["data"], wrong, tmp_path / "cache")
        assert list((tmp_path / "cache").iterdir()) == []  # nothing half written is kept
        unlisted = (wire.ModelFile("../run/secret", 1, "0" * 64),)
        with pytest.raises(ConfigError, match="a model file with a bad name"):
            fetch(srv.ports["data"], unlisted, tmp_path / "cache")
        sock = ctx.socket(zmq.DEALER)
        sock.connect(f"tcp://127.0.0.1:{srv.ports['data']}")
        try:  # the consumer serves only what it listed, whatever a peer asks for
            for name in ("model/tokenizer_config.json.bak", "model/../config.json", "model/"):
                sock.send(wire.encode(wire.FileChunkRequest(1, -1, name, 0, 64)))
                assert sock.poll(10_000)
                refused = wire.decode_reply([f.buffer for f in sock.recv_multipart(copy=False)])
                assert isinstance(refused, wire.Reject)
                assert refused.reason == "bad_value"
        finally:
            sock.close(linger=0)


def test_the_session_is_built_on_the_fetched_model(tmp_path, tiny_model_dir):
    cfg = C.override(C.Config(), {"producer.engine": "hf"})
    spec = run_spec(cfg, vocab_size=0, model=str(tmp_path / "on-the-consumers-host"))
    spec = dataclasses.replace(spec, model_files=listing(tiny_model_dir))
    asked: list[tuple[wire.ModelFile, ...]] = []

    async def fetched(files: tuple[wire.ModelFile, ...]) -> Path:
        asked.append(files)
        return tiny_model_dir

    async def session(fetch):
        ctx = zmq.asyncio.Context()
        try:
            built, key = await open_session(
                cfg,
                spec,
                kept=None,
                rng=random.Random(0),
                push=lambda: ctx.socket(zmq.PUSH),
                fetch=fetch,
            )
            await built.engine.close()
            return key
        finally:
            ctx.destroy(linger=0)

    assert asyncio.run(session(fetched))[0] == str(tiny_model_dir)
    assert asked == [spec.model_files]
    with pytest.raises(ConfigError, match="is not a Hugging Face model directory"):
        asyncio.run(session(None))  # no way to fetch: the old one line


def far_producer(connect: str, hidden: Path, home: Path, log: Path) -> subprocess.Popen[bytes]:
    """An hf producer process on another "host": its own directory and HOME (`home`), the
    consumer's directory `hidden` empty for it (its own mount namespace): no copy of the model,
    no hub."""
    return cli(
        *("producer", "--connect", connect, "--engine", "hf", "--id", "far"),
        log=log,
        hide=(hidden,),
        cwd=home,
        env={"HOME": str(home), "HF_HUB_OFFLINE": "1"},
    )


def fetched(home: Path) -> list[Path]:
    models = home / ".cache" / "asyncgrpo" / "models"
    return sorted(models.iterdir()) if models.exists() else []


needs_hiding = pytest.mark.skipif(
    bool(hiding_unavailable()), reason=hiding_unavailable() or "available"
)


@needs_hiding
@pytest.mark.slow  # 22-32 s on this 2-core machine under load: two processes, the hf engine
@pytest.mark.timeout(240)
def test_a_producer_process_on_a_host_without_the_model_fetches_it_and_trains(
    tmp_path, tiny_model_dir
):
    """A real consumer (host a) and a producer that has no copy of its model (host b): the
    producer fetches the weights and tokenizer over the data socket, each file checked, and
    the run trains two steps on its groups alone. Fast beside it: the refusal below runs the
    same wiring (a producer process, no copy, the fetch) and the tests above the fetch itself."""
    a, home = tmp_path / "a", tmp_path / "b"
    home.mkdir()
    model, run_dir = a / "model", a / "run"
    shutil.copytree(tiny_model_dir, model)
    length_reward = 'rewards.fns=[{fn="reward_fixtures:length", weight=1.0}]'
    extra = ("staleness.max_staleness=0", "train.lr=0.02", length_reward)
    args = consumer_args(run_dir, model, write_prompts(a / "prompts.jsonl"), *extra)
    args[args.index("--steps") + 1] = "2"
    consumer = cli(*args, log=a / "consumer.log")
    procs = [consumer]
    try:
        producer = far_producer(endpoint(run_dir, procs), a, home, home / "far.log")
        procs.append(producer)
        wait_for(
            lambda: consumer.poll() is not None,
            timeout_s=200,
            what="the consumer's end",
            procs=[producer],
        )
        assert consumer.returncode == 0, (a / "consumer.log").read_text()[-3000:]
        assert producer.wait(60) == 0, (home / "far.log").read_text()[-3000:]
    finally:
        stop(*procs)
    said = (home / "far.log").read_text()
    assert "this host has no copy of the consumer's model: fetching its 5 files" in said, said
    (got,) = fetched(home)
    assert f"fetched the consumer's model into {got}" in said
    listed = sorted(p.name for p in model.iterdir())
    assert sorted(p.name for p in got.iterdir()) == listed
    for name in listed:
        assert (got / name).read_bytes() == (model / name).read_bytes()
    metrics = read_jsonl(run_dir / RF.METRICS)
    assert [m["step"] for m in metrics] == [1, 2]
    ledger = assert_run_balanced(run_dir)
    assert set(ledger.by_producer) == {"far"}  # trained on the far producer's groups only
    assert ledger.count("far", "trained") == 2 * 4  # train.prompts_per_step groups a step


@needs_hiding
@pytest.mark.timeout(90)
def test_a_producer_process_refuses_a_fetched_file_that_does_not_match_in_one_line(
    tmp_path, tiny_model_dir
):
    """A file of the consumer's model changed after the consumer listed it: the producer
    process exits 2 with one `error:` line naming the file and keeps nothing (a consumer's
    network thread in this process serves the files)."""
    a, home = tmp_path / "a", tmp_path / "b"
    home.mkdir()
    model = a / "model"
    shutil.copytree(tiny_model_dir, model)
    (a / "run").mkdir()
    with started_server(CFG, a / "run", model=str(model)) as (srv, _):
        changed = model / "generation_config.json"
        good = changed.read_bytes()
        changed.write_bytes(good[:-1] + (b" " if good.endswith(b"\n") else b"\n"))
        connect = f"tcp://127.0.0.1:{srv.ports['control']}"
        producer = far_producer(connect, a, home, home / "far.log")
        try:
            code = producer.wait(60)
        finally:
            stop(producer)
    said = (home / "far.log").read_text()
    assert code == 2, said
    assert "Traceback" not in said, said
    (error,) = [line for line in said.splitlines() if line.startswith("error:")]
    assert "model file generation_config.json fetched does not match the run spec" in error
    assert fetched(home) == []  # nothing half written is kept

"""A replay in one process (consumer/replay.py) on the tiny model: a recorded stream trains to
the same snapshot hashes every time (a stream of multi-turn episodes too), a replay's own stream
replays to its hashes, a changed TIS
cap differs from the first step with its |Δparam| named, and a recording the config does not
match is refused naming the file and the step; a replay from a checkpoint continues to the
same hashes."""

from __future__ import annotations

from pathlib import Path

import pytest
from replay_streams import EPISODES, STEPS, P, config, record, replay

from common.errors import ConfigError, StreamError
from common.files import run_files as RF
from consumer.replay import Replay, compare
from consumer.stream import reader as R
from consumer.stream.recorder import STREAM
from consumer.train import checkpoint


def replays_itself(tmp_path: Path, model_dir: Path, **sets: object) -> dict[int, str]:
    """Record a run, replay it twice (the same hashes) and replay the replay's own stream (no
    difference at any version); the first replay's hashes."""
    source = tmp_path / "run"
    record(source)
    first = replay(model_dir, source, tmp_path / "a", **sets)
    assert sorted(first) == list(range(STEPS + 1))
    assert replay(model_dir, source, tmp_path / "b", **sets) == first
    again = replay(model_dir, tmp_path / "a", tmp_path / "c", **sets)  # the replay's own stream
    cmp = compare(
        R.index(tmp_path / "a" / STREAM).snapshots,
        again,
        source=tmp_path / "a",
        run_dir=tmp_path / "c",
    )
    assert cmp.compared == list(range(STEPS + 1))
    assert cmp.first_diff is None
    return first


def test_a_stream_replays_to_the_same_hashes_and_a_replay_replays_itself(tmp_path, tiny_model_dir):
    replays_itself(tmp_path, tiny_model_dir)
    balance = RF.read_ledger(tmp_path / "a").balance
    assert (balance.trained, balance.dropped_stale) == (STEPS * P, STEPS)


def test_a_multi_turn_stream_replays_bit_for_bit(tmp_path, tiny_model_dir):
    source = tmp_path / "run"
    record(source, episodes=True)
    first = replay(tiny_model_dir, source, tmp_path / "a", **EPISODES)
    assert sorted(first) == list(range(STEPS + 1))
    assert replay(tiny_model_dir, source, tmp_path / "b", **EPISODES) == first
    again = replay(tiny_model_dir, tmp_path / "a", tmp_path / "c", **EPISODES)  # its own stream
    assert again == first


def test_a_changed_tis_cap_differs_from_the_first_step_with_its_delta(tmp_path, tiny_model_dir):
    source = tmp_path / "run"
    record(source)
    base = replay(tiny_model_dir, source, tmp_path / "a")
    capped = replay(tiny_model_dir, source, tmp_path / "b", **{"loss.tis_cap": 1.001})
    cmp = compare(base, capped, source=tmp_path / "a", run_dir=tmp_path / "b")
    assert cmp.first_diff == 1
    assert cmp.max_abs_delta is not None
    assert cmp.max_abs_delta > 0


def test_a_recording_the_config_does_not_match_is_refused_at_its_step(tmp_path, tiny_model_dir):
    source = tmp_path / "run"
    record(source, micro_batches=7)
    with pytest.raises(StreamError, match=r"000000\.seg: step 0: 1 micro-batches where the"):
        replay(tiny_model_dir, source, tmp_path / "a")
    with pytest.raises(StreamError, match=r"000000\.seg: step 0: a recorded group does not fit"):
        replay(tiny_model_dir, source, tmp_path / "b", **{"sampling.group_size": 2})


def test_a_replay_from_a_checkpoint_continues_to_the_same_hashes(tmp_path, tiny_model_dir):

    from common.files import run_files as RF

    source = tmp_path / "run"
    record(source)
    whole = replay(tiny_model_dir, source, tmp_path / "a")
    first = tmp_path / "first"  # one step, then a checkpoint in the recorded run's directory
    first.mkdir()
    cfg = config(tiny_model_dir, first)
    part = Replay(cfg, first, R.index(source / STREAM), source, check_passes=True)
    part.run(1)
    checkpoint.save(source, trainer=part.trainer, version=1, book_state=RF.BookState(book={}))
    rest = tmp_path / "rest"
    rest.mkdir()
    r = Replay(config(tiny_model_dir, rest), rest, R.index(source / STREAM), source,
               check_passes=True)  # fmt: skip
    with pytest.raises(ConfigError, match="holds only its checkpoint of version 1"):
        r.start_from(2)
    r.start_from(1)
    done = r.run(None)
    assert done.steps == STEPS - 1
    assert done.hashes == {v: whole[v] for v in range(1, STEPS + 1)}


def test_a_replay_says_its_progress_while_it_trains(tmp_path, tiny_model_dir, monkeypatch):
    from launch import dashboard
    from launch.cli import replay as cli

    watched: list[tuple[object, ...]] = []

    class Watch:  # launch.dashboard.Progress, which logs a line every 10 s and each tenth
        def __init__(self, run_dir, steps):
            watched.append(("made", run_dir, steps))

        def start(self):
            watched.append(("start",))

        def stop(self):
            watched.append(("stop",))

    monkeypatch.setattr(dashboard, "Progress", Watch)
    source, out = tmp_path / "run", tmp_path / "a"
    record(source)
    out.mkdir()
    recording = R.index(source / STREAM)
    cli._run(config(tiny_model_dir, out), out, source, recording, (None, None, False, True), [])
    assert watched == [("made", out, STEPS), ("start",), ("stop",)]


def test_a_lora_run_replays_bit_for_bit(tmp_path, tiny_model_dir):
    """With `model.lora.enabled` the snapshots are adapters, and a replay reproduces every one
    of their hashes, its own stream too."""
    from common.weights import adapter as fmt

    lora = {"model.lora.enabled": True, "model.lora.rank": 4}
    first = replays_itself(tmp_path, tiny_model_dir, **lora)
    last = tmp_path / "a" / RF.SNAPSHOTS / f"v{STEPS:06d}" / "model.safetensors"
    assert fmt.read_header(last) is not None  # an adapter, not the model
    assert len(set(first.values())) == STEPS + 1  # every version's adapter differs

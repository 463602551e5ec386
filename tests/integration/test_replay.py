"""A replay in one process (consumer/replay.py) on the tiny model: a recorded stream trains to
the same snapshot hashes every time, a replay's own stream replays to its hashes, a changed TIS
cap differs from the first step with its |Δparam| named, and a recording the config does not
match is refused naming the file and the step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common import config as C
from common import wire
from common.errors import StreamError
from consumer.replay import Replay, compare
from consumer.stream import reader as R
from consumer.stream.recorder import STREAM, Recorder
from consumer.stream.records import StepEntry

P, G, STEPS = 2, 4, 3


def config(model: Path, run_dir: Path, **extra: object) -> C.Config:
    return C.override(C.Config(), {
        "model.path": str(model), "run.dir": str(run_dir), "sampling.group_size": G,
        "sampling.max_new_tokens": 6, "train.prompts_per_step": P, "train.lr": 1e-2,
        "snapshot.dtype": "float32", "snapshot.keep_last": 100, "snapshot.fsync": "off",
        "model.torch_threads": 1, "train.eval_every": 0, "run.record_stream": True, **extra,
    })  # fmt: skip


def group(lease_id: int, rng: np.random.Generator, version: int) -> wire.Group:
    lens = rng.integers(2, 7, G).astype(np.int32)
    n = int(lens.sum())
    return wire.Group(
        lease_id=lease_id, producer_id="p1", prompt_index=lease_id, behavior_version=version,
        prompt_ids=rng.integers(4, 20, 5).astype(np.int32),
        completion_ids=rng.integers(4, 20, n).astype(np.int32), completion_lens=lens,
        behavior_logp=-rng.uniform(0.5, 4.0, n).astype(np.float32),
        token_versions=np.zeros(0, np.int32), rewards=rng.integers(0, 2, G).astype(np.float32),
        finish_reasons=("length",) * G, temperature=1.0,
    )  # fmt: skip


def record(run_dir: Path, **entry: object) -> None:
    """A stream of STEPS steps of P random groups (and one dropped group per step)."""
    rng, rec, lease = np.random.default_rng(0), Recorder(run_dir), 0
    for v in range(STEPS):
        kept = []
        for _ in range(P + 1):
            rec.group(group(lease, rng, max(v - 1, 0)))
            kept.append(lease)
            lease += 1
        dropped = ((kept.pop(), "dropped_stale"),)
        rec.step(StepEntry(version=v, kept=tuple(kept), dropped=dropped, **entry))  # type: ignore[arg-type]
    rec.close()


def replay(model: Path, source: Path, out: Path, **extra: object) -> dict[int, str]:
    out.mkdir()
    recording = R.index(source / STREAM)
    done = Replay(config(model, out, **extra), out, recording, source, check_passes=True).run(None)
    assert done.steps == STEPS
    return done.hashes


def test_a_stream_replays_to_the_same_hashes_and_a_replay_replays_itself(tmp_path, tiny_model_dir):
    source = tmp_path / "run"
    record(source)
    first = replay(tiny_model_dir, source, tmp_path / "a")
    assert sorted(first) == list(range(STEPS + 1))
    assert replay(tiny_model_dir, source, tmp_path / "b") == first
    again = replay(tiny_model_dir, tmp_path / "a", tmp_path / "c")  # the replay's own stream
    cmp = compare(R.index(tmp_path / "a" / STREAM).snapshots, again, source=tmp_path / "a",
                  run_dir=tmp_path / "c")  # fmt: skip
    assert cmp.compared == list(range(STEPS + 1))
    assert cmp.first_diff is None
    from common import run_files as RF

    balance = RF.read_ledger(tmp_path / "a").balance
    assert (balance.trained, balance.dropped_stale) == (STEPS * P, STEPS)


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

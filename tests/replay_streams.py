"""A recorded stream of random groups for the tiny model, and replays of it in one process
(tests/integration/test_replay.py, tests/gpu/test_replay_gpu.py). With `episodes`, every group
is one of multi-turn episodes: random tokens inserted between sampled ones (`EPISODES`: the
settings a replay of them takes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from common import config as C
from common import wire
from consumer.replay import Replay
from consumer.stream import reader as R
from consumer.stream.recorder import STREAM, Recorder
from consumer.stream.records import StepEntry

P, G, STEPS = 2, 4, 3
EPISODES = {"episodes.env": "guess", "episodes.max_episode_tokens": 64}


def config(model: Path, run_dir: Path, **extra: object) -> C.Config:
    return C.override(C.Config(), {
        "model.path": str(model), "run.dir": str(run_dir), "sampling.group_size": G,
        "sampling.max_new_tokens": 6, "train.prompts_per_step": P, "train.lr": 1e-2,
        "snapshot.dtype": "float32", "snapshot.keep_last": 100, "snapshot.fsync": "off",
        "model.torch_threads": 1, "eval.learner_every_steps": 0, "run.record_stream": True, **extra,
    })  # fmt: skip


def group(
    lease_id: int, rng: np.random.Generator, version: int, *, episodes: bool = False
) -> wire.Group:
    lens = rng.integers(2, 7, G).astype(np.int32) * (3 if episodes else 1)
    n = int(lens.sum())
    mask = np.ones(n, bool)
    if episodes:  # each episode starts sampled, then tokens inserted at random
        mask = rng.random(n) < 0.6
        mask[np.cumsum(lens) - lens] = True
    return wire.Group(
        lease_id=lease_id, producer_id="p1", prompt_index=lease_id, behavior_version=version,
        prompt_ids=rng.integers(4, 20, 5).astype(np.int32),
        completion_ids=rng.integers(4, 20, n).astype(np.int32), completion_lens=lens,
        behavior_logp=-rng.uniform(0.5, 4.0, int(mask.sum())).astype(np.float32),
        token_versions=np.zeros(0, np.int32), rewards=rng.integers(0, 2, G).astype(np.float32),
        finish_reasons=("stop" if episodes else "length",) * G, temperature=1.0,
        sampled_bits=np.packbits(mask, bitorder="little") if episodes else np.zeros(0, np.uint8),
    )  # fmt: skip


def record(run_dir: Path, *, episodes: bool = False, **entry: object) -> None:
    """A stream of STEPS steps of P random groups (and one dropped group per step)."""
    rng, rec, lease = np.random.default_rng(0), Recorder(run_dir), 0
    for v in range(STEPS):
        kept = []
        for _ in range(P + 1):
            rec.group(group(lease, rng, max(v - 1, 0), episodes=episodes))
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

"""Which settings a replay may change (pure: two configs in, a verdict out).

A replay trains on the recorded data, so a setting that decided the data is fixed by the
recording: changing it would train on data the setting could never have produced. Refused,
with why (`DATA_KEYS`, by key or by section):
- `sampling.*` (G, temperature, truncation): the completions and their behaviour log-probs
  were sampled with them;
- `task.*`, `rewards.*`: the prompts and the rewards are in the recording;
- `staleness.*`, `train.prompts_per_step`, `train.drop_zero_variance`: they decided which
  groups each step trained and which were dropped;
- `model.path`, `run.seed`: the initial weights the recording's steps started from.

Everything else may change. The learner's settings are the point of a counterfactual replay
(`loss.*`: TIS mode and cap, clipping, aggregation, KL; `train.lr` and its schedule,
`train.weight_decay`, `train.betas`, `train.grad_clip`), and how the learner computes
(`train.micro_batch_tokens`, `model.attention`, `model.dtype`, ...) or where files and
processes go (`run.*`, `snapshot.*`, `net.*`, `producer.*`) does not touch the data.
"""

from __future__ import annotations

from typing import Any

from common import config as C
from common.errors import ConfigError

DATA_KEYS = {
    "sampling": "the recorded completions and their behaviour log-probs were sampled with it",
    "task": "the recorded prompts came from it",
    "rewards": "the recorded groups carry the rewards the producers scored with it",
    "staleness": "it decided which groups each recorded step trained or dropped",
    "train.prompts_per_step": "each recorded step trained that many groups",
    "train.drop_zero_variance": "it decided which recorded groups were dropped",
    "model.path": "the recorded steps started from that model's weights",
    "run.seed": "the recorded steps started from the weights and order that seed set",
}
# the keys that decide how a step is split into passes (a replay checks them against the record)
PASS_KEYS = ("train.micro_batch_tokens", "model.attention", "train.updates_per_batch")


def flat(cfg: C.Config) -> dict[str, Any]:
    """`section.key -> value` of every setting."""
    return {
        f"{section}.{key}": value
        for section, values in C.to_dict(cfg).items()
        if isinstance(values, dict)
        for key, value in values.items()
    }


def changed(original: C.Config, replay: C.Config) -> list[str]:
    """The keys whose values differ."""
    a, b = flat(original), flat(replay)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def check(original: C.Config, replay: C.Config) -> list[str]:
    """The keys the replay changes, or a `ConfigError` for the first one it may not change."""
    keys = changed(original, replay)
    for key in keys:
        why = DATA_KEYS.get(key) or DATA_KEYS.get(key.split(".")[0])
        if why is not None:
            raise ConfigError(
                f"replay: {key} cannot change ({why}); a replay trains on the recorded data, "
                "so only learner settings (loss.*, train.lr, ...) may differ"
            )
    return keys


def same_passes(original: C.Config, replay: C.Config) -> bool:
    """Whether the replay splits each step into passes as the recording did."""
    a, b = flat(original), flat(replay)
    return all(a.get(k) == b.get(k) for k in PASS_KEYS)

"""What one lease is sampled with and the group message it becomes (pure: no sockets, no engine).

- `sampling_params`: a training lease samples the run's G completions at the run's temperature;
  an evaluation lease (`Lease.eval_version` >= 0: consumer/evaluation/rounds.py) samples
  `RunSpec.eval_samples` at `RunSpec.eval_temperature` with the run's truncation (0 = greedy:
  the top token, no truncation).
- `group_of`: the `wire.Group` of the scored completions, or episodes (producer/episodes/loop.py:
  then every token after the prompt travels, with one bit saying whether the model sampled it,
  and the log-probs, versions and kept sets of the sampled ones). `behavior_version` is the
  oldest version of any sampled token and `token_versions` is sent only when versions differ.
  An evaluation
  group is marked `evaluation` and carries no kept sets (it is never trained); its weights were
  pinned while it was sampled, so all its tokens have the lease's version (asserted).
"""

from __future__ import annotations

import numpy as np

from common import wire
from common.sampling import kept_set
from common.sampling.kept_set import NO_TRUNCATION
from producer.engines.base import Completion, SamplingParams
from producer.episodes.loop import Episode
from producer.rewards.scoring import GroupScore
from producer.session import truncation_of


def sampling_params(
    spec: wire.RunSpec, lease: wire.Lease, *, seed: int, stop_ids: tuple[int, ...]
) -> SamplingParams:
    """How `lease` is sampled (module docstring)."""
    evaluation = lease.eval_version >= 0
    greedy = evaluation and spec.eval_temperature == 0
    return SamplingParams(
        n=spec.eval_samples if evaluation else spec.group_size,
        temperature=spec.eval_temperature if evaluation else spec.temperature,
        max_new_tokens=spec.max_new_tokens,
        seed=seed,
        stop_token_ids=stop_ids,
        truncation=NO_TRUNCATION if greedy else truncation_of(spec),
    )


def group_of(
    producer_id: str,
    lease: wire.Lease,
    prompt_ids: list[int],
    completions: list[Completion] | list[Episode],
    scored: GroupScore,
    *,
    temperature: float,
    gen_s: float,
) -> wire.Group:
    """The group message of `lease`'s scored `completions` or episodes (module docstring)."""
    versions = np.concatenate([c.versions for c in completions]).astype(np.int32)
    behavior = int(versions.min())
    lens = [len(c.token_ids) for c in completions]
    evaluation = lease.eval_version >= 0
    if evaluation:
        assert (versions == lease.eval_version).all(), "an eval group's weights are pinned"
        kept = kept_set.KeptSets()
    else:
        sampled = [len(c.logprobs) for c in completions]  # kept sets are of sampled tokens
        kept = kept_set.concat([c.kept for c in completions], sampled)
    episodes = [c for c in completions if isinstance(c, Episode)]
    bits = np.zeros(0, np.uint8)
    if episodes:
        assert len(episodes) == len(completions), "a group of episodes or of completions"
        mask = np.concatenate([e.sampled for e in episodes])
        bits = np.packbits(mask, bitorder="little")
    return wire.Group(
        lease_id=lease.lease_id,
        producer_id=producer_id,
        prompt_index=lease.prompt_index,
        behavior_version=behavior,
        prompt_ids=np.asarray(prompt_ids, np.int32),
        completion_ids=np.concatenate([c.token_ids for c in completions]),
        completion_lens=np.array(lens, np.int32),
        behavior_logp=np.concatenate([c.logprobs for c in completions]),
        token_versions=versions if (versions != behavior).any() else np.zeros(0, np.int32),
        rewards=scored.rewards,
        finish_reasons=tuple(c.finish_reason for c in completions),
        temperature=temperature,
        num_reward_errors=scored.num_failed,
        gen_s=gen_s,
        kept_counts=kept.other_counts(),
        kept_ids=kept.ids,
        kept_unknown=kept.unknown,
        reward_parts=scored.parts.reshape(-1),
        evaluation=evaluation,
        reward_error=scored.first_error,
        sampled_bits=bits,
        env_s=float(sum(e.env_s for e in episodes)),
    )

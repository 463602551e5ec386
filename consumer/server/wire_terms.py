"""The run's terms on the wire, from its config: the run spec every producer is welcomed with
(`run_spec`) and what a group message may hold when the consumer decodes it (`group_limits`).

Runs where the server is built (the learner's main thread; the replay reads its limits too).
"""

from __future__ import annotations

import logging

from common import wire
from common.config import Config

log = logging.getLogger("asyncgrpo.consumer")


def run_spec(cfg: Config, *, vocab_size: int, model: str) -> wire.RunSpec:
    """What every producer is told at registration; ports stay 0 until the server has bound."""
    s = cfg.sampling
    return wire.RunSpec(
        group_size=s.group_size,
        vocab_size=vocab_size,
        max_staleness=cfg.staleness.max_staleness,
        temperature=s.temperature,
        top_p=s.top_p,
        top_k=s.top_k,
        min_p=s.min_p,
        max_kept=s.max_kept,
        max_new_tokens=s.max_new_tokens,
        prompt_format=cfg.task.prompt_format,
        model=model,
        rollouts_port=0,
        announce_port=0,
        heartbeat_s=cfg.net.heartbeat_s,
        max_message_bytes=int(cfg.net.max_message_mib * (1 << 20)),
        reward_fns=tuple(wire.RewardWeight(r.fn, r.weight) for r in cfg.rewards.fns),
        reward_timeout_s=cfg.rewards.timeout_s,
        data_port=0,
        eval_samples=cfg.eval.samples_per_prompt,
        eval_temperature=cfg.eval.temperature,
        episodes=cfg.episodes.spec(),
    )


def group_limits(cfg: Config, max_bytes: int, *, vocab_size: int) -> wire.Limits:
    """What a group message may hold: the run's G, vocabulary, temperature, lengths and kept
    sets (required, of at most max_kept ids, exactly when the run samples truncated)."""
    s = cfg.sampling
    # per token: id, log-prob, version (when the weights changed mid-group), set size, and the
    # other max_kept - 1 kept ids
    worst = s.group_size * s.max_new_tokens * (9 + 4 * s.max_kept)
    if s.truncation.active and worst > max_bytes:
        log.warning(
            "truncated sampling: a group of %d x %d tokens with full kept sets of "
            "sampling.max_kept = %d ids takes %.0f MiB > net.max_message_mib = %.0f and would "
            "be refused (too_large); typical top-p sets are far smaller (kept_size_mean in "
            "metrics.jsonl), else raise net.max_message_mib or lower sampling.max_kept",
            s.group_size,
            s.max_new_tokens,
            s.max_kept,
            worst / 2**20,
            max_bytes / 2**20,
        )
    return wire.Limits(
        max_message_bytes=max_bytes,
        vocab_size=vocab_size,
        group_size=s.group_size,
        temperature=s.temperature,
        eval_group_size=cfg.eval.samples_per_prompt,
        eval_temperature=cfg.eval.temperature,
        max_prompt_tokens=s.max_prompt_tokens,
        # an episode's completion is all of it after the prompt, the environment's tokens too
        max_completion_tokens=(
            cfg.episodes.max_episode_tokens if cfg.episodes.on else s.max_new_tokens
        ),
        max_kept=s.max_kept if s.truncation.active else 0,
        num_reward_fns=len(cfg.rewards.fns),
    )

"""Multi-turn episodes on SmolLM2-135M-Instruct: ours (token-in/token-out) against the naive way
(the conversation rendered again by the chat template and tokenized whole), same episodes.

    python bench/episodes_exact.py --model models/smollm2-135m-instruct --json out.json

The hf engine samples `--prompts` groups of G episodes (the built-in `guess` environment on
chat-templated synthetic additions, at most 3 model turns of `--max-new-tokens`, temperature 1,
float32 on the CPU); the learner (`DeviceTrainer`, the same weights) recomputes log-probs:
- ours: of the episode's own ids (sampled turns, the environment's deltas between them), at the
  sampled tokens: `ours_abs_diff_max` (|learner - engine|, the exactness target: <= 1e-4) and
  `ours_ratio_mean` (mean of exp(learner - engine) over sampled tokens: 1);
- naive: the conversation's messages rendered by `apply_chat_template` and tokenized as one text;
  each assistant message's tokens there (by character offsets) paired position by position with
  the behaviour log-probs of that turn's sampled tokens, as a trainer that re-tokenizes would
  pair them: `naive_ratio_mean`, `naive_abs_log_ratio_mean` (mean |log ratio|),
  `naive_tokens_differ_frac` (paired positions whose token id is not the sampled one, plus the
  sampled tokens it has no position for), `naive_episodes_differ_frac` (episodes whose ids
  differ anywhere);
- the wire: `inserted_bytes_per_token` (bytes the environment's tokens add to the group message,
  against the same group with them left out) and `sampled_bytes_per_token` (the group's bytes
  per sampled token).
Other keys: episodes, turns_mean, sampled_tokens, inserted_tokens, load_avg_1min, wall_s.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import config as C
from common import wire
from common.task.synthetic import make_examples
from consumer.train.trainer import DeviceTrainer
from producer.engines.base import SamplingParams
from producer.engines.hf import HFEngine
from producer.episodes.loop import Episode, run_episodes
from producer.episodes.render import TurnRenderer
from producer.episodes.runner import EnvRunner
from producer.groups import group_of
from producer.rewards.scoring import GroupScore
from producer.tokenizer import PromptCodec


async def sample(
    args: argparse.Namespace,
) -> tuple[PromptCodec, list[wire.Group], list[list[Episode]]]:
    codec = PromptCodec(args.model, "chat", vocab_size=49152)
    engine = HFEngine(args.model, device="cpu", seed=0)
    await engine.load_weights(args.model, 0)
    spec = wire.EpisodeSpec("guess", 3, 512, 10.0, 0.0, 1.5)
    runner = EnvRunner(spec, workers=1)
    renderer = TurnRenderer(codec)
    rows = make_examples("train", args.prompts, seed=1)

    async def one(i: int) -> tuple[wire.Group, list[Episode]]:
        text = (
            f"What is {rows[i].prompt[:-1]}? Answer with the number only, zero-padded to 3 digits."
        )
        lease = wire.Lease(i, i, 0, 0, text, rows[i].answer, (), "")
        params = SamplingParams(
            n=args.group_size,
            temperature=1.0,
            max_new_tokens=args.max_new_tokens,
            seed=100 + i,
            stop_token_ids=codec.stop_ids,
        )
        prompt, episodes = await run_episodes(
            engine,
            renderer,
            runner,
            lease=lease,
            spec=spec,
            params=params,
            count=lambda k, n: None,
        )
        scored = GroupScore(np.array([e.reward or 0.0 for e in episodes], np.float32), 0)
        g = group_of("bench", lease, prompt, episodes, scored, temperature=1.0, gen_s=0.0)
        return g, episodes

    try:
        done = await asyncio.gather(*(one(i) for i in range(args.prompts)))
    finally:
        runner.close()
        await engine.close()
    return codec, [g for g, _ in done], [e for _, e in done]


def naive(codec: PromptCodec, trainer: DeviceTrainer, g: wire.Group, e: Episode) -> dict[str, Any]:
    """The naive re-tokenization of one episode: paired log-ratios and id mismatches."""
    tok = codec.tokenizer
    assert tok is not None
    text = tok.apply_chat_template(e.messages, tokenize=False)
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    naive_group = dataclasses.replace(
        g,
        prompt_ids=np.array(ids[:1], np.int32),
        completion_ids=np.array(ids[1:], np.int32),
        completion_lens=np.array([len(ids) - 1], np.int32),
        behavior_logp=np.zeros(len(ids) - 1, np.float32),
        token_versions=np.zeros(0, np.int32),
        rewards=np.zeros(1, np.float32),
        finish_reasons=("stop",),
        sampled_bits=np.zeros(0, np.uint8),
        reward_parts=np.zeros(0, np.float32),
    )
    learner = np.concatenate([[0.0], trainer.logprobs([naive_group])[0]])  # by position in ids
    ratios, differ, paired_total = [], 0, 0
    turn_ids = _turns(e)
    for k, (sampled_ids, behavior) in enumerate(turn_ids):
        start, end = _assistant_span(tok, e.messages, k)
        at = [j for j, (a, b) in enumerate(offsets) if a >= start and b <= end and b > a]
        n = min(len(at), len(sampled_ids))
        for j in range(n):
            ratios.append(float(learner[at[j]] - behavior[j]))
            differ += ids[at[j]] != sampled_ids[j]
        differ += len(sampled_ids) - n
        paired_total += len(sampled_ids)
    ours = g.prompt_ids.tolist() + e.token_ids.tolist()
    return {
        "log_ratios": ratios,
        "differ": differ,
        "total": paired_total,
        "episode_differs": ids[: len(ours)] != ours,
    }


def _turns(e: Episode) -> list[tuple[list[int], np.ndarray]]:
    """Each model turn's sampled ids and behaviour log-probs (the stop token included)."""
    out, at, start = [], 0, 0
    mask = e.sampled
    while start < len(mask):
        if not mask[start]:
            start += 1
            continue
        stop = start
        while stop < len(mask) and mask[stop]:
            stop += 1
        n = stop - start
        out.append((e.token_ids[start:stop].tolist(), e.logprobs[at : at + n]))
        at, start = at + n, stop
    return out


def _assistant_span(tok: Any, messages: list[dict[str, str]], k: int) -> tuple[int, int]:
    """Characters [start, end) of the k-th assistant message's content and its end token in the
    whole rendered conversation."""
    index = [i for i, m in enumerate(messages) if m["role"] == "assistant"][k]
    before = tok.apply_chat_template(messages[:index], tokenize=False, add_generation_prompt=True)
    upto = tok.apply_chat_template(messages[: index + 1], tokenize=False)
    return len(before), len(upto.rstrip("\n"))


def wire_bytes(g: wire.Group) -> tuple[float, float]:
    """(bytes per inserted token, bytes per sampled token) of a group of episodes."""
    mask = g.sampled_mask()
    lens = [int(m.sum()) for m in np.split(mask, np.cumsum(g.completion_lens)[:-1])]
    without = dataclasses.replace(
        g,
        completion_ids=g.completion_ids[mask],
        completion_lens=np.array(lens, np.int32),
        sampled_bits=np.zeros(0, np.uint8),
    )
    full, sampled_only = len(wire.encode(g)), len(wire.encode(without))
    inserted = int((~mask).sum())
    return (full - sampled_only) / max(inserted, 1), sampled_only / g.num_sampled


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True, help="the converted model directory")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    t0, load = time.perf_counter(), os.getloadavg()[0]
    codec, groups, episodes = asyncio.run(sample(args))
    cfg = C.override(C.Config(), {"model.device": "cpu", "model.torch_threads": args.threads})
    trainer = DeviceTrainer(cfg, args.model)
    diffs, ratios = [], []
    for g in groups:
        for learner, (_, behavior) in zip(
            trainer.logprobs([g]), [g.completion(i) for i in range(g.group_size)], strict=True
        ):
            diffs.append(np.abs(learner - behavior).max())
            ratios += np.exp(learner - behavior).tolist()
    naive_rows = [
        naive(codec, trainer, g, e) for g, eps in zip(groups, episodes, strict=True) for e in eps
    ]
    log_ratios = np.array([r for n in naive_rows for r in n["log_ratios"]])
    flat = [e for eps in episodes for e in eps]
    inserted, sampled = zip(*(wire_bytes(g) for g in groups), strict=True)
    out = {
        "episodes": len(flat),
        "turns_mean": float(np.mean([e.turns for e in flat])),
        "sampled_tokens": int(sum(e.sampled.sum() for e in flat)),
        "inserted_tokens": int(sum((~e.sampled).sum() for e in flat)),
        "ours_abs_diff_max": float(max(diffs)),
        "ours_ratio_mean": float(np.mean(ratios)),
        "naive_ratio_mean": float(np.exp(log_ratios).mean()),
        "naive_abs_log_ratio_mean": float(np.abs(log_ratios).mean()),
        "naive_tokens_differ_frac": sum(n["differ"] for n in naive_rows)
        / max(sum(n["total"] for n in naive_rows), 1),
        "naive_episodes_differ_frac": float(np.mean([n["episode_differs"] for n in naive_rows])),
        "inserted_bytes_per_token": float(np.mean(inserted)),
        "sampled_bytes_per_token": float(np.mean(sampled)),
        "load_avg_1min": round(load, 2),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

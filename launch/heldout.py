"""Held-out evaluation of a model or snapshot on the user's own split, scored as training is.

What is evaluated (`describe(cfg)` says it in words, `has_heldout(cfg)` whether there is any):
- `task.eval_path` set: its rows, read like task.path (JSONL, Parquet or a Hugging Face
  dataset: consumer/data/sources.py), each prompt formatted as producers format it (text
  per `task.prompt_format`, chat messages with the chat template: producer/tokenizer.py), one
  completion per prompt, greedy or sampled at
  `sampling.temperature` over the full vocabulary (`task.eval_mode`, seeded by `run.seed`), at
  most `sampling.max_new_tokens` tokens, cut at the first stop token, and scored by
  `rewards.fns` with their weights through the producers' own reward runner (time limits and
  worker isolation included), each reward given the row as in training (prompt, answer, the
  other columns). The score is the mean reward per prompt: the accuracy, for a
  0/1 reward.
- otherwise, for the synthetic task: greedy accuracy on its whole held-out split
  (`consumer.evaluate.greedy_accuracy`, what `asyncgrpo launch` reports);
- otherwise (a task of your own without `eval_path`): nothing; the sweep reports reward curves.

`evaluate_run(cfg, run_dir, model_dir)`: the starting model and the snapshot the run ended with,
scored so, written to RUN_DIR/eval.json (`initial_accuracy`, `final_accuracy`: the scores;
`heldout_size`, `final_version`, `model`, `heldout`: `describe(cfg)`), what `asyncgrpo launch`
prints at the end of a run.

`eval_target(path, snapshot, eval_path=...)`: what `asyncgrpo eval PATH` scores: a run
directory (its final snapshot) or a snapshot inside one is scored on that run's own task and
rewards (RUN/config.toml); a run whose task has no held-out split is refused with a line
naming `task.eval_path` (never scored on the built-in addition split instead); any other
directory is a model scored on the synthetic held-out split.

Runs in the calling process, on the first visible CUDA GPU if there is one, else the CPU.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.config import Config
from consumer.data.rows import PromptRow


@dataclass(frozen=True, slots=True)
class HeldOutScore:
    score: float  # mean reward per prompt (accuracy for a 0/1 reward)
    size: int  # prompts scored


@dataclass(frozen=True, slots=True)
class EvalTarget:
    cfg: Config | None  # the run's config; None: a bare model on the synthetic split
    model_dir: Path
    snapshot: Path | None  # a snapshot directory or model.safetensors over model_dir's weights


def eval_target(path: Path, snapshot: Path | None, *, eval_path: Path | None) -> EvalTarget:
    """What `asyncgrpo eval PATH` scores (module docstring); a `ConfigError` with one line
    when PATH is a run whose task it cannot score."""
    from common import config as C
    from common.errors import ConfigError
    from common.files import run_files as RF
    from common.host.model_dir import local_model_dir
    from common.weights import snapshot as snap

    run_dir = None
    if (path / RF.CONFIG).is_file():
        run_dir = path
    elif path.parent.name == RF.SNAPSHOTS and (path.parent.parent / RF.CONFIG).is_file():
        run_dir, snapshot = path.parent.parent, path
    if run_dir is None:
        return EvalTarget(None, path, snapshot)
    cfg = C.load(run_dir / RF.CONFIG)
    if eval_path is not None:
        cfg = C.override(cfg, {"task.eval_path": str(eval_path.resolve())})
    if not has_heldout(cfg):
        raise ConfigError(
            f"{run_dir}: its task (task.source = {cfg.task.source!r}, task.path = "
            f"{cfg.task.path!r}) has no held-out rows to score; give them with --eval-path "
            "(read like task.path) or set task.eval_path in its config.toml"
        )
    if snapshot is None and path == run_dir:
        versions = snap.list_versions(run_dir / RF.SNAPSHOTS)
        final = snap.final_version(run_dir)
        if not versions:
            raise ConfigError(f"{run_dir}: no snapshot to score")
        version = final if final in versions else versions[-1]
        snapshot = snap.snapshot_dir(run_dir / RF.SNAPSHOTS, version)
    return EvalTarget(cfg, local_model_dir(cfg.model.path), snapshot)


def has_heldout(cfg: Config) -> bool:
    return bool(cfg.task.eval_path) or cfg.task.source == "synthetic"


def describe(cfg: Config) -> str:
    if cfg.task.eval_path:
        return f"mean reward, {cfg.task.eval_mode}, {Path(cfg.task.eval_path).name}"
    if cfg.task.source == "synthetic":
        return "greedy accuracy, synthetic held-out split"
    return ""


def examples(cfg: Config) -> list[PromptRow]:
    """The rows of `task.eval_path`, read like task.path (a `ConfigError` naming the file, row
    and field if one is malformed)."""
    from consumer.data.sources import load_rows

    return load_rows(cfg.task, held_out=True)


def evaluate(cfg: Config, model_dir: Path, snapshot: Path | None = None) -> HeldOutScore:
    """The score of `model_dir` (with `snapshot`'s weights over it, if given)."""
    if not cfg.task.eval_path:
        assert cfg.task.source == "synthetic", "has_heldout(cfg) is checked first"
        from consumer.evaluate import greedy_accuracy

        result = greedy_accuracy(model_dir, snapshot=snapshot)
        return HeldOutScore(result.accuracy, result.total)
    import torch

    from consumer.evaluate import load_model
    from producer.tokenizer import PromptCodec

    rows = examples(cfg)
    model, _ = load_model(model_dir, snapshot)
    if torch.cuda.is_available():
        model = model.to("cuda")
    codec = PromptCodec(model_dir, cfg.task.prompt_format, vocab_size=model.config.vocab_size)
    torch.manual_seed(cfg.run.seed)
    texts = []
    for start in range(0, len(rows), 32):
        prompts = [codec.encode(r.messages or r.prompt) for r in rows[start : start + 32]]
        texts += [codec.decode(ids) for ids in _complete(model, prompts, codec.stop_ids, cfg)]
    rewards = asyncio.run(_score(cfg, texts, rows))
    return HeldOutScore(sum(rewards) / len(rewards), len(rewards))


def _prompt_of(row: PromptRow) -> str | list[dict[str, str]]:
    """The prompt as rewards receive it (text, or the chat messages as dicts)."""
    return [{"role": t.role, "content": t.content} for t in row.messages] or row.prompt


def _complete(model: Any, prompts: list[list[int]], stop_ids: tuple[int, ...], cfg: Config) -> Any:
    """Completion token ids (numpy, cut before the first stop token) of left-padded prompts."""
    import torch

    pad = stop_ids[0] if stop_ids else 0
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    device = next(model.parameters()).device
    sampled = cfg.task.eval_mode == "sampled"
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=cfg.sampling.max_new_tokens,
            do_sample=sampled,
            temperature=cfg.sampling.temperature if sampled else None,
            top_k=0 if sampled else None,
            top_p=1.0 if sampled else None,
            pad_token_id=pad,
            eos_token_id=list(stop_ids) or None,
        )
    rows = []
    for row in out[:, width:].cpu().numpy():
        stops = [i for i, t in enumerate(row) if int(t) in stop_ids]
        rows.append(row[: stops[0]] if stops else row)
    return rows


async def _score(cfg: Config, texts: list[str], rows: list[PromptRow]) -> list[float]:
    from producer.rewards.runner import RewardRunner

    runner = RewardRunner(
        cfg.rewards.fns, timeout_s=cfg.rewards.timeout_s, workers=cfg.rewards.workers
    )
    async with runner:
        scored = await asyncio.gather(
            *(
                runner.score([t], r.answer, prompt=_prompt_of(r), columns=r.columns)
                for t, r in zip(texts, rows, strict=True)
            )
        )
    return [float(s.rewards[0]) for s in scored]


def evaluate_run(cfg: Config, run_dir: Path, model_dir: Path) -> dict[str, Any] | None:
    """Score the start and the end of a finished run (module docstring); None without a
    snapshot or without a held-out split."""
    import json

    from common.weights import snapshot as snap

    if not has_heldout(cfg):
        return None
    if not cfg.task.eval_path:
        from consumer.evaluate import evaluate_run as synthetic_run

        result = synthetic_run(run_dir, model_dir)
        if result is not None:
            result["heldout"] = describe(cfg)
            (run_dir / "eval.json").write_text(json.dumps(result, indent=1))
        return result
    root = run_dir / "snapshots"
    versions = snap.list_versions(root)
    version = snap.final_version(run_dir)
    if version is None or version not in versions:
        if not versions:
            return None
        version = versions[-1]
    start = evaluate(cfg, model_dir)
    final = evaluate(cfg, model_dir, snap.snapshot_dir(root, version))
    result: dict[str, Any] = {
        "initial_accuracy": start.score, "final_accuracy": final.score,
        "heldout_size": final.size, "final_version": version, "model": str(model_dir),
        "heldout": describe(cfg),
    }  # fmt: skip
    (run_dir / "eval.json").write_text(json.dumps(result, indent=1))
    return result

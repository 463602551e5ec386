"""Evaluation, one room: every way of evaluating a model is one function here, named for what it
does, configured by one section (`[eval]`, common/config/evaluation.py). Each writes its files
and metrics once, through the parts below; the threads and commands that evaluate call these.

- `evaluate_in_learner` (consumer/learner.py): greedy accuracy every `eval.learner_every_steps`
  on the training thread, which waits for it;
- `evaluate_beside_replay` (consumer/replay.py): the same, in a spawned process
  (`asyncgrpo-eval`) beside a replay's training;
- `evaluate_through_producers` (consumer/server/server.py): eval rounds every `eval.every_steps`
  versions, leased by the network thread to producers holding the version (producer/pins.py
  pins it there): reward, pass@k, the learner never waiting but at the end:
  `await_last_round` (consumer/learner.py) waits up to `eval.final_wait_s` for the round of
  the run's last version, so its last metrics line reports it;
- `score_run_ends` (`asyncgrpo launch`, after the run): the start and the final model on the
  whole held-out split, RUN/eval.json;
- `score_model` (`asyncgrpo eval RUN`, the stress sweep's snapshots): one model or snapshot on a
  run's held-out split, scored with its rewards;
- `greedy_accuracy` (`asyncgrpo eval MODEL_DIR`): a bare model on the synthetic held-out split;
- `dry_run` (`asyncgrpo launch --dry-run`): the run's first prompts sampled G times with the
  starting model and scored by its rewards, before any training.

The parts:
- greedy.py: the greedy rule (load a model and a snapshot over it, decode, judge) and the
  metrics fields of one greedy evaluation;
- periodic.py: the learner's cadence (`LearnerEval`);
- child.py: the replay's evaluation process (`EvalProcess`);
- rounds.py: evaluation rounds and eval leases, a pure state machine on the network thread;
- heldout.py: a run's held-out rows scored with its rewards (the producers' prompt format and
  reward runner lent as a `Judge`);
- preflight.py: a few training prompts sampled and scored, each completion and function shown;
- report.py: what evaluation during training shows a user (summary.md, reward.png, the
  progress line).

With `eval.every_steps` on, the producers evaluate during training and the learner's own
evaluation is off: `evaluate_in_learner` says so once at start. Heavy imports (torch,
transformers) happen inside the calls.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from common import wire
from common.config import Config
from common.files import run_files as RF

if TYPE_CHECKING:
    from consumer.data.rows import PromptRow
    from consumer.evaluation.child import EvalProcess
    from consumer.evaluation.greedy import EvalResult
    from consumer.evaluation.heldout import HeldOutScore, JudgeFactory
    from consumer.evaluation.periodic import LearnerEval
    from consumer.evaluation.preflight import DryGroup
    from consumer.evaluation.rounds import EvalBook

log = logging.getLogger("asyncgrpo.consumer")


def evaluate_in_learner(cfg: Config, model_dir: Path | None) -> LearnerEval:
    """The learner's own evaluation on its training thread (off while the producers evaluate:
    said once, here)."""
    from consumer.evaluation.periodic import LearnerEval

    if cfg.eval.learner_every_steps and cfg.eval.on:
        log.info(
            "eval.every_steps = %d: the producers evaluate during training; the learner's own "
            "evaluation (eval.learner_every_steps = %d) is off",
            cfg.eval.every_steps,
            cfg.eval.learner_every_steps,
        )
    every = cfg.eval.learner_every_steps if cfg.eval.in_learner else 0
    return LearnerEval(cfg, model_dir, every_steps=every)


def evaluate_beside_replay(cfg: Config, model_dir: Path) -> EvalProcess | None:
    """A replay's evaluation process (started now: its imports overlap the first steps), at the
    learner's cadence whether or not the original run's producers evaluated (a replay has
    none); None when nothing would be evaluated."""
    from consumer.evaluation.periodic import LearnerEval

    every = LearnerEval(cfg, model_dir, every_steps=cfg.eval.learner_every_steps).every_steps
    if not every:
        return None
    from consumer.evaluation.child import EvalProcess, EvalSpec

    spec = EvalSpec(
        model_dir=str(model_dir),
        num_prompts=cfg.eval.learner_prompts,
        seed=cfg.run.seed,
        max_new_tokens=cfg.sampling.max_new_tokens,
        every_steps=every,
    )
    return EvalProcess(spec)


def evaluate_through_producers(
    cfg: Config, *, ack: Callable[[str, wire.Ack], None], incarnation: int
) -> tuple[EvalBook, list[PromptRow]] | None:
    """The network thread's eval rounds (their acks queued with `ack`, their lease ids marked
    with the consumer's `incarnation`) and the held-out rows they lease, read now; None with
    `eval.every_steps` off."""
    if not cfg.eval.on:
        return None
    from consumer.data.sources import round_rows
    from consumer.evaluation.rounds import EvalBook

    rows = round_rows(cfg)
    book = EvalBook(
        len(rows),
        every_steps=cfg.eval.every_steps,
        samples=cfg.eval.samples_per_prompt,
        pass_reward=cfg.eval.pass_reward,
        ack=ack,
        incarnation=incarnation,
        last_version=cfg.run.steps if cfg.eval.final_wait_s > 0 else 0,
    )
    return book, rows


class _Publishing(Protocol):  # consumer/step.py `Steps`, as far as the last round needs it
    version: int
    published: int

    def publish(self) -> None: ...


class _AwaitingRounds(Protocol):  # consumer/server/server.py `Server`
    def await_round(self, version: int, timeout_s: float, stop: threading.Event) -> bool: ...


def await_last_round(
    cfg: Config, server: _AwaitingRounds, steps: _Publishing, stop: threading.Event
) -> None:
    """Before the last metrics line of a run of `run.steps`: its last version published (if it
    was not yet), then up to `eval.final_wait_s` for that version's round through the
    producers (consumer/evaluation/rounds.py begins it whatever `eval.every_steps`), unless
    `stop` (Ctrl-C) is set meanwhile."""
    wait_s = cfg.eval.final_wait_s
    if not cfg.eval.on or wait_s <= 0:
        return
    if steps.published != steps.version:
        steps.publish()
    log.info(
        "evaluating v%d through the producers (up to %g s: eval.final_wait_s)",
        steps.version,
        wait_s,
    )
    if server.await_round(steps.version, wait_s, stop):
        return
    if stop.is_set():
        log.info("the evaluation of v%d is not waited for: the run stops", steps.version)
    else:
        log.warning(
            "the evaluation of v%d did not end within eval.final_wait_s = %g s: not reported",
            steps.version,
            wait_s,
        )


Progress = Callable[[int], None]  # told the problems done so far (common/progress.py Counter)


def score_model(
    cfg: Config,
    model_dir: Path,
    snapshot: Path | None = None,
    *,
    judge: JudgeFactory,
    progress: Callable[[int], Progress] | None = None,
) -> HeldOutScore:
    """`model_dir` (with `snapshot`'s weights over it, if given) on the run's held-out split:
    a run with episodes, the success of its held-out episodes; else `eval.path` scored with the
    run's rewards (`judge` lends them), else greedy accuracy on the synthetic split.
    `has_heldout(cfg)` is checked first. `progress(total)`, if given, makes what is told the
    problems done as they are (not for episodes)."""
    from consumer.evaluation import heldout

    if cfg.episodes.on:
        return heldout.episode_success(cfg, model_dir, snapshot, judge=judge)
    if cfg.eval.path:
        return heldout.mean_reward(cfg, model_dir, snapshot, judge=judge, progress=progress)
    assert cfg.task.source == "synthetic", "has_heldout(cfg) is checked first"
    result = greedy_accuracy(model_dir, snapshot=snapshot, progress=progress)
    return heldout.HeldOutScore(result.accuracy, result.total)


def score_run_ends(
    cfg: Config,
    run_dir: Path,
    model_dir: Path,
    *,
    judge: JudgeFactory,
    progress: Callable[[str, int], Progress] | None = None,
) -> dict[str, Any] | None:
    """The starting model and the snapshot `run_dir` ended with (its `final.json`; the newest on
    disk if it never ended cleanly), scored by `score_model` and written to RUN_DIR/eval.json
    (`initial_accuracy`, `final_accuracy`, `heldout_size`, `final_version`, `model`, `heldout`:
    `describe(cfg)`); None without a held-out split or without a snapshot. `progress(which,
    total)`, if given, makes what is told each model's problems done ("final snapshot",
    "starting model")."""
    from common.weights import snapshot as snap

    if not has_heldout(cfg):
        return None
    versions = snap.list_versions(run_dir / RF.SNAPSHOTS)
    if not versions:
        return None
    if snap.final_version(run_dir) not in versions:
        log.warning("%s has no final.json: evaluating its newest snapshot", run_dir)
    version = final_version(run_dir)
    final = score_model(
        cfg,
        model_dir,
        snap.snapshot_dir(run_dir / RF.SNAPSHOTS, version),
        judge=judge,
        progress=(lambda total: progress(f"final snapshot v{version}", total))
        if progress
        else None,
    )
    start = score_model(
        cfg,
        model_dir,
        judge=judge,
        progress=(lambda total: progress("starting model", total)) if progress else None,
    )
    result = {
        "initial_accuracy": start.score,
        "final_accuracy": final.score,
        "heldout_size": final.size,
        "final_version": version,
        "model": str(model_dir),
        "heldout": describe(cfg),
    }
    (run_dir / RF.EVAL).write_text(json.dumps(result, indent=1))
    return result


def greedy_accuracy(
    model_dir: Path,
    *,
    snapshot: Path | None = None,
    n: int | None = None,
    seed: int = 0,
    batch_size: int = 64,
    progress: Callable[[int], Progress] | None = None,
) -> EvalResult:
    """Greedy accuracy of a model directory (with `snapshot`'s weights over it) on the first `n`
    problems of the synthetic held-out split (default: all of them), `batch_size` at a time
    (`progress(total)`: told the problems done after each batch)."""
    from common.task.synthetic import make_examples
    from consumer.evaluation.greedy import accuracy_of, load_model

    model, tokenizer = load_model(Path(model_dir), snapshot)
    examples = make_examples("heldout", n, seed=seed)
    told = progress(len(examples)) if progress is not None else None
    return accuracy_of(model, tokenizer, examples, batch_size=batch_size, progress=told)


def dry_run(
    cfg: Config, model_dir: Path, *, judge: JudgeFactory, num_prompts: int
) -> list[DryGroup]:
    """The first `num_prompts` training prompts, each sampled G times with `model_dir` and
    scored by the run's rewards (`judge` lends them): consumer/evaluation/preflight.py."""
    from consumer.evaluation.preflight import sample_and_score

    return sample_and_score(cfg, model_dir, judge=judge, num_prompts=num_prompts)


@dataclass(frozen=True, slots=True)
class EvalTarget:
    cfg: Config | None  # the run's config; None: a bare model on the synthetic split
    model_dir: Path
    snapshot: Path | None  # a snapshot directory or model.safetensors over model_dir's weights


def eval_target(path: Path, snapshot: Path | None, *, eval_path: Path | None) -> EvalTarget:
    """What `asyncgrpo eval PATH` scores: a run directory (its final snapshot) or a snapshot
    inside one is scored on that run's own task and rewards (RUN/config.toml); a run whose task
    has no held-out split is refused with a line naming `eval.path` (never scored on the
    built-in addition split instead); any other directory is a model scored on the synthetic
    held-out split."""
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
        cfg = C.override(cfg, {"eval.path": str(eval_path.resolve())})
    if not has_heldout(cfg):
        raise ConfigError(
            f"{run_dir}: its task (task.source = {cfg.task.source!r}, task.path = "
            f"{cfg.task.path!r}) has no held-out rows to score; give them with --eval-path "
            "(read like task.path) or set eval.path in its config.toml"
        )
    if snapshot is None and path == run_dir:
        snapshot = snap.snapshot_dir(run_dir / RF.SNAPSHOTS, final_version(run_dir))
    return EvalTarget(cfg, local_model_dir(cfg.model.path), snapshot)


def final_version(run_dir: Path) -> int:
    """The version a run ended with (its `final.json`; the newest snapshot on disk if it never
    ended cleanly); a `ConfigError` when it has no snapshot."""
    from common.errors import ConfigError
    from common.files import run_files as RF
    from common.weights import snapshot as snap

    versions = snap.list_versions(run_dir / RF.SNAPSHOTS)
    final = snap.final_version(run_dir)
    if not versions:
        raise ConfigError(f"{run_dir}: no snapshot to score")
    return final if final in versions else versions[-1]


def has_heldout(cfg: Config) -> bool:
    """Whether the run has held-out rows to score: `eval.path`, or the synthetic task's split."""
    return bool(cfg.eval.path) or cfg.task.source == "synthetic"


def describe(cfg: Config) -> str:
    """The held-out score in a few words ("" without one)."""
    if cfg.episodes.on and has_heldout(cfg):
        rows = Path(cfg.eval.path).name if cfg.eval.path else "synthetic held-out split"
        return f"success of {cfg.eval.mode} episodes ({cfg.episodes.env}), {rows}"
    if cfg.eval.path:
        return f"mean reward, {cfg.eval.mode}, {Path(cfg.eval.path).name}"
    if cfg.task.source == "synthetic":
        return "greedy accuracy, synthetic held-out split"
    return ""

"""The per-step metrics contract (`StepRecord`) and the JSONL sink.

`metrics.jsonl` in the run directory has one JSON object per optimizer step, written by the
learner. `StepRecord` is its one typed definition: the learner builds one per step (an unknown
or missing name is a `TypeError` there, at once, not a silently empty plot later) and every
reader (the live dashboard, `asyncgrpo report`, the stress sweep, the benchmarks) reads lines
back with `read_steps` / `StepRecord.from_json` and uses its attributes. Values are numbers, or
small dicts of a fixed size (histograms, producers by state; each producer's own view is in
producers.json: common/files/run_files.py); NaN/inf are written as null.

On disk a line is `to_json()`: every field, except the optional ones that are None (what the
stand-in trainer or a step without evaluation does not measure), keys sorted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

log = logging.getLogger("asyncgrpo")


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """One optimizer step of the learner. Times in seconds; rates per second of wall time."""

    # -- the learner: always present -----------------------------------------------------------
    step: int  # policy version after this step (= optimizer steps taken)
    time_s: float  # since the learner started its loop
    unix_time: float  # wall clock at the end of the step
    step_wall_s: float  # since the previous step ended
    reward_mean: float  # over every completion trained this step
    reward_std: float
    # over every completion of every group that arrived for this step, those dropped (zero
    # variance, stale) included: the policy's sampled reward, which `reward_mean` is not once
    # groups start to be all right (absent from runs older than the field); the headline
    # number (consumer/reward_tally.py)
    reward_mean_seen: float | None = None
    frac_reward_zero_std: float  # groups seen (kept or dropped) whose rewards were all equal
    # {reward function: its own mean score} over the completions of every group that arrived
    # (names: common/config/run.py reward_names; None: no producer sent per-function scores)
    reward_fn_means: dict[str, float] | None = None
    staleness_mean: float  # learner version - behaviour version, over the trained groups
    staleness_max: int
    staleness_hist: dict[str, int]  # {lag: trained groups} (keys are strings in JSON)
    tokens_per_s: float  # completion tokens trained / step_wall_s
    learner_idle_frac: float  # wait_s / step_wall_s
    wait_s: float  # waiting for groups
    # previous optimizer step's end -> this step's first admitted group (None at the first
    # step); at max_staleness 0 the synchronous round trip: settle, publish, announce, lease,
    # reload, one generation, send
    round_trip_s: float | None = None
    publish_submit_s: float  # handing the snapshot to the publisher
    snapshot_write_s: float  # the publisher's last write (its own thread)
    num_completion_tokens: int
    groups_trained: int  # the ledger's counts so far
    groups_dropped_stale: int
    groups_dropped_zero_variance: int
    groups_rejected_invalid: int
    groups_expired: int
    leases_open: int
    rejected_messages: int  # messages the consumer refused (rejected.<reason> in the ledger)
    # -- absent from runs older than the field -------------------------------------------------
    producers_live: int | None = None  # producers registered and neither gone nor left
    producers_by_state: dict[str, int] | None = None  # {state: producers}, as of the last
    # write of producers.json (every few seconds, consumer/server/roster.py: each producer's view)
    # -- only in runs older than producers.json: every producer's view in every line ------------
    producers: dict[str, dict[str, Any]] | None = None  # {producer: {"version", "state"}}
    producer_counters: dict[str, dict[str, float]] | None = None  # {producer: its counters}
    world_size: int | None = None  # learner ranks (torchrun); 1 = one process
    # -- backpressure (consumer/server/admission.py; absent from runs older than the fields)
    # ----------
    queued_groups: int | None = None  # admitted groups waiting for the learner, at step end
    queued_bytes: int | None = None  # their encoded bytes (bounded by net.max_queued_mib)
    queued_groups_peak: int | None = None  # the most waiting at once since the previous step
    queued_bytes_peak: int | None = None
    groups_held: int | None = None  # finished groups producers hold until told to send
    holds: int | None = None  # times a producer was told to hold a group, so far
    hold_s_mean: float | None = None  # told to hold -> admitted, over the groups admitted so far
    hold_s_max: float | None = None
    # -- the publisher (absent from runs older than the field) ---------------------------------
    snapshots_superseded: int | None = None  # snapshots skipped for a newer one, so far
    # -- the trackers (consumer/loggers/; absent from runs older than the fields) -------------
    loggers_dropped: int | None = None  # items a full logger queue dropped, so far
    loggers_failed: int | None = None  # trackers dropped after an exception, so far
    metrics_lines_lost: int | None = None  # metrics.jsonl lines a failed write lost, so far
    # -- the trainer (None when the stand-in trainer does not measure it) ----------------------
    step_s: float | None = None  # the optimizer step itself
    loss: float | None = None  # the loss of the step's batch (mean over its updates)
    num_tokens: float | None = None  # valid completion tokens in the loss
    grad_norm: float | None = None  # before clipping
    lr: float | None = None  # the learning rate this step (its first update) used
    entropy: float | None = None  # of the sampling distribution, nats per token
    clip_frac_low: float | None = None  # consumer/train/loss.py METRIC_KEYS, same meaning
    clip_frac_high: float | None = None
    clip_frac_dual: float | None = None
    ratio_min: float | None = None
    ratio_max: float | None = None
    tis_weight_mean: float | None = None
    tis_weight_sum: float | None = None
    tis_weight_sq_sum: float | None = None
    tis_frac_truncated: float | None = None
    tis_ess: float | None = None  # effective sample size (Σw)² / (n·Σw²) in (0, 1]
    attention: str | None = None  # the learner's attention path (consumer/train/attention.py)
    padding_frac: float | None = None  # model input positions that were padding (0 when packed)
    # rows' tokens the decoder did not run because a group's prompt ran once (shared_prompt)
    positions_saved_frac: float | None = None
    micro_batches: int | None = None  # forward/backward passes in the step
    # torch threads of the step's units (mean: each pass's start, and on a CPU each decoder
    # layer's forward and backward), and the host's cores as the learner saw them at the step's
    # start: who was busy with how many threads (common/host/core_board.py)
    learner_threads: float | None = None
    cores: str | None = None
    pass_threads: list[int] | None = None  # each unit's threads in order (the stream has them)
    behavior_gap_abs_mean: float | None = None
    behavior_gap_abs_max: float | None = None
    kl_behavior: float | None = None
    kl_ref: float | None = None
    # -- truncated sampling (docs/sampling.md; absent from runs older than the fields) ---------
    ratio_out_of_band: float | None = None  # tokens whose old/behaviour ratio is off [0.9, 1.1]
    kept_mass_mean: float | None = None  # the policy's mass S on each token's kept set (1 =
    # untruncated)
    kept_size_mean: float | None = None  # |K| per token (the vocabulary size untruncated)
    tokens_kept_unknown: int | None = None  # tokens not trained: the engine could not record K
    # -- multi-turn episodes (`[episodes]`, consumer/episode_tally.py): over every group of
    # episodes that arrived for the step; absent from runs of single completions -------------
    episode_turns_mean: float | None = None  # model turns per episode
    episode_tokens_mean: float | None = None  # tokens after the prompt, sampled and inserted
    episode_sampled_frac: float | None = None  # the share of them the model sampled
    env_s_mean: float | None = None  # seconds per episode in its environment
    env_errors: int | None = None  # episodes an environment failed (never trained)
    episode_ends: dict[str, int] | None = None  # {finish reason: episodes}
    # -- the learner's held-out evaluation (steps with eval.learner_every_steps) ----------------
    heldout_accuracy: float | None = None
    eval_s: float | None = None
    # -- evaluation during training through the producers (`[eval]`; consumer/server/
    # eval_book.py): a version's result in the line of the step at which its round completed --
    eval_version: int | None = None  # the policy version evaluated (sampled with exactly it)
    eval_reward_mean: float | None = None  # over every completion of the held-out prompts
    eval_pass_at_1: float | None = None  # mean over prompts of c/n (reward >= eval.pass_reward)
    eval_pass_at_k: float | None = None  # unbiased pass@k, k = eval_k (common/task/pass_at_k.py)
    eval_k: int | None = None  # eval.samples_per_prompt
    eval_completion_len_mean: float | None = None  # tokens per completion
    eval_prompts: int | None = None  # held-out prompts in the round
    # the eval ledger so far (every step with evaluation on): leases issued, and how they ended
    eval_leases_issued: int | None = None
    eval_leases_answered: int | None = None
    eval_leases_declined: int | None = None  # given back: the producer held another version
    eval_leases_expired: int | None = None
    eval_prompts_skipped: int | None = None  # nobody could sample their version any more
    eval_rounds_skipped: int | None = None  # rounds not reported: some prompt was skipped
    # rounds that evaluated a newer version than the one that began them (producers had
    # skipped it while reloading): `eval_version` says which
    eval_rounds_retargeted: int | None = None

    def to_json(self) -> dict[str, Any]:
        """The line's object: optional fields that are None are left out."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: v for k, v in out.items() if v is not None or k in _REQUIRED}

    @property
    def reward_headline(self) -> float:
        """The reward a user watches: over every group that arrived (`reward_mean_seen`),
        or the trained groups' mean in runs older than that field."""
        return self.reward_mean if self.reward_mean_seen is None else self.reward_mean_seen

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepRecord:
        """A record from one line's object; keys this version does not know are ignored (a
        newer writer), a missing required one is a `ValueError` naming it."""
        absent = _REQUIRED - data.keys()
        if absent:
            raise ValueError(f"a metrics line lacks {', '.join(sorted(absent))}")
        return cls(**{k: v for k, v in data.items() if k in _FIELDS})


_FIELDS = frozenset(f.name for f in dataclasses.fields(StepRecord))
_REQUIRED = frozenset(
    f.name
    for f in dataclasses.fields(StepRecord)
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
)


class JsonlWriter:
    """Append-only JSON lines, flushed per line (a crash loses at most the line being written).

    A line whose write fails (a full or failing disk) is lost, not raised: `lost` counts them,
    the first failure is logged with the file and the error, and the next write starts on a
    new line of a reopened file (a torn fragment stays a line of its own, which readers skip).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lost = 0  # lines a failed write lost
        self._file: TextIO | None = open(path, "a", buffering=1)  # noqa: SIM115 (see close())
        self._torn = False

    def write(self, record: dict[str, Any] | StepRecord) -> bool:
        """Append one line; False if it was lost (counted in `lost`)."""
        data = record.to_json() if isinstance(record, StepRecord) else record
        text = json.dumps(_finite(data), sort_keys=True) + "\n"
        try:
            if self._file is None:
                self._file = open(self.path, "a", buffering=1)  # noqa: SIM115
            self._file.write("\n" + text if self._torn else text)
        except OSError as exc:
            self._lose(exc)
            return False
        self._torn = False
        return True

    def _lose(self, exc: OSError) -> None:
        if not self.lost:
            log.warning(
                "cannot write %s (%s): its lines are lost, and counted, until it can",
                self.path,
                exc,
            )
        self.lost += 1
        self._torn = True
        if self._file is not None:
            with contextlib.suppress(OSError):  # what it still buffers is part of the lost line
                self._file.close()
            self._file = None

    def flush(self) -> None:
        if self._file is not None:
            try:
                self._file.flush()
            except OSError as exc:
                self._lose(exc)

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSONL file; a torn last line (crash mid-write) is skipped."""
    return list(_parse(path.read_text().splitlines()))


def read_steps(path: Path) -> list[StepRecord]:
    """The steps of a `metrics.jsonl` (none when the file does not exist yet)."""
    return [StepRecord.from_json(d) for d in read_jsonl(path)] if path.exists() else []


def _parse(lines: Iterable[str]) -> Iterable[dict[str, Any]]:
    for line in lines:
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue


def _finite(value: Any) -> Any:
    """NaN/inf become None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value

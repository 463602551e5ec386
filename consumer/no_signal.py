"""Whether the arriving groups carry a learning signal, what to say when they do not, and when
to give up.

A group carries a signal when its G rewards are not all equal: otherwise every advantage is
zero and training on it changes nothing. The learner's collection loop (consumer/learner.py)
hands every group that arrives for training to `SignalWatch.add`, kept or dropped (a stale
group is not shown: its rewards were never in question, and it neither counts nor ends a
streak). The watch keeps:
- the totals: groups arrived, and how many of them carried a signal;
- the streak: groups in a row without a signal, since when (monotonic seconds), and what they
  had in common, so `why()` can say it in one line: reward calls failed in every group (with
  the first failure's line, `wire.Group.reward_error`, sent by the producer), every completion
  scored the same value (`0.0`: the task too hard for the model, or the reward never pays), or the
  prompts held tokens the model's tokenizer does not know (`unknown_id`, its `<unk>`);
- `exhausted(now)`: the budget is spent, i.e. the streak holds `max_groups` groups
  (`run.no_signal_groups`) or has lasted `max_s` seconds (`run.no_signal_s`) with groups still
  arriving (0 turns a limit off). Time counts only between arrivals: a pipeline that stalled
  (no group at all) is not a task without signal and is never stopped for it.

The learner writes `state()` to `signal.json` (common/files/run_files.py `Signal`) so that the
launcher's console, the dashboard and `asyncgrpo status` say what is happening before the
first step; when the budget is spent it stops the run (exit 3, `EXIT_NO_SIGNAL`) with `why()`
in final.json and summary.md. `SignalWatch` is pure (no I/O, the clock is an argument);
`watch_signal` builds the learner's from the config and the model's tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from common import wire
from common.config import Config
from common.files import run_state as RS
from common.host.model_dir import DEMO_CHARS_HINT, is_demo_model


@dataclass
class Streak:
    """Groups in a row without a signal, and what they had in common."""

    groups: int = 0
    since: float = 0.0  # monotonic time of its first group
    last: float = 0.0  # monotonic time of its newest group
    failed: int = 0  # groups with a failed reward call (scored 0 by the producer)
    first_error: str = ""  # the first failed reward call of the streak (any group)
    unknown: int = 0  # groups whose prompt held the tokenizer's unknown token
    values: set[float] = field(default_factory=set)  # the reward values seen (up to 3)


@dataclass
class SignalWatch:
    """See the module docstring. `unknown_id`: the model tokenizer's unknown token (None: the
    tokenizer can encode any text); `unknown_token`: its text, and `unknown_hint` what the
    tokenizer does know (the demo model's), for messages."""

    max_groups: int
    max_s: float
    unknown_id: int | None = None
    unknown_token: str = "<unk>"
    unknown_hint: str = ""
    groups: int = 0
    with_signal: int = 0
    streak: Streak = field(default_factory=Streak)
    first_error: str = ""  # the run's first failed reward call, signal or not (summary.md)

    def add(self, group: wire.Group, now: float) -> None:
        """Count one arriving training group (its rewards, failures and prompt)."""
        self.groups += 1
        if group.reward_error and not self.first_error:
            self.first_error = group.reward_error
        rewards = group.rewards
        if not bool(np.all(rewards == rewards[0])):
            self.with_signal += 1
            self.streak = Streak()
            return
        s = self.streak
        if not s.groups:
            s.since = now
        s.groups += 1
        s.last = now
        if group.num_reward_errors:
            s.failed += 1
        if group.reward_error and not s.first_error:
            s.first_error = group.reward_error
        if self.unknown_id is not None and bool(np.any(group.prompt_ids == self.unknown_id)):
            s.unknown += 1
        if len(s.values) < 3:
            s.values.add(float(rewards[0]))

    def exhausted(self, now: float) -> bool:
        """The streak has spent the budget (module docstring); False while groups carry one."""
        s = self.streak
        if not s.groups:
            return False
        by_count = self.max_groups > 0 and s.groups >= self.max_groups
        by_time = self.max_s > 0 and now - s.since >= self.max_s
        return by_count or by_time

    def why(self) -> str:
        """What the current streak shows, in one line ("" when the newest group had a signal)."""
        s = self.streak
        if not s.groups:
            return ""
        if s.failed == s.groups:
            first = f" (first: {s.first_error})" if s.first_error else ""
            return f"reward calls failed in every group{first}; a failed call scores 0"
        if s.unknown * 2 > s.groups:
            hint = f"{self.unknown_hint}; " if self.unknown_hint else ""
            return (
                f"{s.unknown} of these groups' prompts hold tokens the model's tokenizer does "
                f"not know ({self.unknown_token}), so the model cannot read them ("
                f"{hint}docs/custom_task/README.md)"
            )
        said = "every completion of each group scored the same"
        if len(s.values) == 1:
            said = f"every completion scored {next(iter(s.values)):g}"
        failed = f"; reward calls failed in {s.failed} of them" if s.failed else ""
        hint = (
            "is the task too hard or too easy for this model, or the reward constant? "
            "(`asyncgrpo launch --dry-run` shows completions and their rewards)"
        )
        return f"{said}{failed}: {hint}"

    def stop_reason(self, now: float) -> str:
        """Why the run stops once the budget is spent (final.json, summary.md, the console)."""
        s = self.streak
        return (
            f"no learning signal in {s.groups} groups in a row over {now - s.since:.0f} s "
            f"({budget_text(self.max_groups, self.max_s)}): {self.why()}"
        )

    def state(self, now: float, *, stopped: bool = False) -> RS.Signal:
        """What `signal.json` holds now."""
        s = self.streak
        return RS.Signal(
            groups=self.groups,
            with_signal=self.with_signal,
            streak=s.groups,
            streak_s=round(now - s.since, 1) if s.groups else 0.0,
            why=self.why(),
            stopped=stopped,
            max_groups=self.max_groups,
            max_s=self.max_s,
            first_error=self.first_error,
        )


def budget_text(max_groups: int, max_s: float) -> str:
    """`run.no_signal_groups = 2000 / run.no_signal_s = 300 s` as a phrase for messages."""
    parts = []
    if max_groups:
        parts.append(f"run.no_signal_groups = {max_groups}")
    if max_s:
        parts.append(f"run.no_signal_s = {max_s:g} s")
    return " or ".join(parts)


def watch_signal(cfg: Config, model_dir: Path | None) -> SignalWatch:
    """The learner's watch: the budget of `[run]`, the unknown token of the model's tokenizer
    (and, for the demo model, what its tokenizer knows)."""
    unknown_id, unknown_text = unknown_token(model_dir)
    return SignalWatch(
        cfg.run.no_signal_groups,
        cfg.run.no_signal_s,
        unknown_id=unknown_id,
        unknown_token=unknown_text,
        unknown_hint=DEMO_CHARS_HINT if is_demo_model(model_dir) else "",
    )


def unknown_token(model_dir: Path | None) -> tuple[int | None, str]:
    """The unknown token's id and text of `model_dir`'s tokenizer ((None, "") without one: a
    byte-level tokenizer encodes any text; or without a tokenizer that loads)."""
    if model_dir is None:
        return None, ""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError):  # no tokenizer: the producers say so, in one line
        return None, ""
    unk = tokenizer.unk_token_id
    return (None, "") if unk is None else (int(unk), str(tokenizer.unk_token))

"""The headline numbers of a run, as every view shows them (progress line, dashboard,
summary.md): one definition, so the views cannot disagree.

- The reward is the mean over every group that arrived for the step (`reward_mean_seen`,
  consumer/reward_tally.py), with the trained groups' mean and the share of groups whose
  completions all scored the same (no learning signal) beside it: `reward 0.62 (trained 0.41,
  equal 55%)`. A run older than `reward_mean_seen` shows its trained mean alone.
- "No signal": when at least `NO_SIGNAL_FRAC` of the arrived groups had equal rewards in the
  last step (or, before any step, every finished group was dropped for it), the views say so
  in one line (`no_signal`), the line the consumer also logs, so a user never needs
  consumer.log to learn that the task is too hard or too easy for the model.
- Per-reward-function means (`reward_fn_means`): `exact_match 0.41 · boxed_format 0.90`.
- The signal watch (`signal.json`, consumer/no_signal.py), which sees every group as it arrives:
  before the first step, how many groups arrived and how many carried a learning signal; and
  whenever the newest groups carried none (before the first step, any; later, at least
  `STREAK_SHOWN` in a row), why (every reward call failing, with the first failure's line; one
  reward value for everything; prompts the tokenizer cannot read) and when the run stops for
  it (`signal_text`). That is what a user sees within seconds of the first groups, where the
  per-step numbers need a step.
"""

from __future__ import annotations

from common.files import run_files as RF
from common.files import run_state as RS
from common.files.metrics import StepRecord

STREAK_SHOWN = 32  # groups in a row without a signal that the views mention once steps run
NO_SIGNAL_FRAC = 0.9  # share of arrived groups with equal rewards that counts as "no signal"
NO_SIGNAL_HINT = (
    "no signal: {share} groups had equal rewards for every completion: is the task too hard "
    "or too easy for this model, or the reward constant? (docs/observability.md)"
)


def reward_text(rec: StepRecord) -> str:
    """`reward 0.620 (trained 0.410, equal 55%)`: see the module docstring."""
    if rec.reward_mean_seen is None:
        return f"reward {rec.reward_mean:.3f}"
    return (
        f"reward {rec.reward_mean_seen:.3f} (trained {rec.reward_mean:.3f}, "
        f"equal {rec.frac_reward_zero_std:.0%})"
    )


def fn_means_text(rec: StepRecord) -> str:
    """`exact_match 0.410 · boxed_format 0.900` ("" when the run has no per-function means)."""
    means = rec.reward_fn_means or {}
    return " · ".join(f"{name} {value:.3f}" for name, value in means.items())


def no_signal(rec: StepRecord | None, ledger: RF.Balance | None = None) -> str | None:
    """The "no signal" line when the newest step (or, before the first, the ledger: groups
    dropped for equal rewards and none trained) says the rewards carry no signal; else None."""
    if rec is not None:
        if rec.frac_reward_zero_std >= NO_SIGNAL_FRAC:
            return NO_SIGNAL_HINT.format(share=f"{rec.frac_reward_zero_std:.0%} of the")
        return None
    if ledger is not None and ledger.dropped_zero_variance and not ledger.trained:
        return NO_SIGNAL_HINT.format(share=f"all {ledger.dropped_zero_variance}")
    return None


def signal_text(sig: RS.Signal | None, *, stepped: bool) -> str:
    """What the signal watch says (module docstring); `stepped`: the first step was taken. ""
    when it has nothing to say (no group yet, or the newest groups carry a signal)."""
    if sig is None:
        return ""
    out = [] if stepped else [f"{sig.groups} groups arrived, {sig.with_signal} with a signal"]
    if sig.streak and sig.why and (not stepped or sig.streak >= STREAK_SHOWN):
        if sig.stopped:
            out.append(f"stopped: no learning signal in {sig.streak} groups in a row: {sig.why}")
        else:
            out.append(
                f"no signal in the last {sig.streak} groups ({sig.streak_s:.0f} s): {sig.why}"
                + _stops_in(sig)
            )
    return " — ".join(out)


def _stops_in(sig: RS.Signal) -> str:
    """`; the run stops after 1688 more such groups or in 276 s (run.no_signal_groups,
    run.no_signal_s)`: what is left of the budget ("" when it is off)."""
    left = []
    if sig.max_groups:
        left.append(f"after {max(sig.max_groups - sig.streak, 0)} more such groups")
    if sig.max_s:
        left.append(f"in {max(sig.max_s - sig.streak_s, 0):.0f} s")
    limits = (("run.no_signal_groups", sig.max_groups), ("run.no_signal_s", sig.max_s))
    keys = ", ".join(k for k, v in limits if v)
    return f"; the run stops {' or '.join(left)} ({keys})" if left else ""

"""What evaluation during training (`[eval]`: consumer/evaluation/rounds.py) shows a user: each
evaluated version's line in summary.md, its points in reward.png, and one short text for the
progress line and the dashboard. Pure reads of `StepRecord`s (common/files/metrics.py): a version's
result sits in the metrics line of the step at which its round completed (`eval_version` says
which version it is).
"""

from __future__ import annotations

from common.files.metrics import StepRecord


def eval_results(records: list[StepRecord]) -> list[StepRecord]:
    """The records that carry a version's evaluation, in order."""
    return [r for r in records if r.eval_version is not None]


def eval_text(records: list[StepRecord]) -> str:
    """The newest evaluation in a few words ('' when there is none): for the progress line and
    the dashboard."""
    done = eval_results(records)
    if not done:
        return ""
    r = done[-1]
    return (
        f"eval v{r.eval_version} reward {r.eval_reward_mean:.3f} pass@1 {r.eval_pass_at_1:.3f}"
        + (f" pass@{r.eval_k} {r.eval_pass_at_k:.3f}" if (r.eval_k or 1) > 1 else "")
    )


def eval_lines(records: list[StepRecord]) -> list[str]:
    """summary.md's section: one row per evaluated version, and the eval ledger."""
    done = eval_results(records)
    last = records[-1] if records else None
    if not done and (last is None or last.eval_leases_issued is None):
        return []
    k = (done[-1].eval_k or 1) if done else 1
    at_k = f" pass@{k} |" if k > 1 else ""
    out = [
        "",
        "## Evaluation during training",
        "",
        "Held-out prompts sampled by the producers with exactly each version "
        "(`[eval]`; docs/observability.md):",
        "",
        f"| version | reward mean | pass@1 |{at_k} mean length | prompts |",
        "|---:|---:|---:|" + ("---:|" if k > 1 else "") + "---:|---:|",
    ]
    for r in done:
        cell = f" {r.eval_pass_at_k:.3f} |" if k > 1 else ""
        out.append(
            f"| {r.eval_version} | {r.eval_reward_mean:.3f} | {r.eval_pass_at_1:.3f} |{cell} "
            f"{r.eval_completion_len_mean:.1f} | {r.eval_prompts} |"
        )
    if last is not None and last.eval_leases_issued is not None:
        out += [
            "",
            f"Eval leases: issued {last.eval_leases_issued}, answered "
            f"{last.eval_leases_answered}, given back {last.eval_leases_declined}, expired "
            f"{last.eval_leases_expired}; prompts skipped {last.eval_prompts_skipped}, rounds "
            f"skipped {last.eval_rounds_skipped} (nobody held the version any more).",
        ]
    return out


def eval_series(records: list[StepRecord]) -> list[tuple[list[float], list[float], str]]:
    """reward.png's evaluation curves against the version evaluated: (xs, ys, label)."""
    done = eval_results(records)
    if not done:
        return []
    xs = [float(r.eval_version or 0) for r in done]
    k = done[-1].eval_k or 1
    out = [(xs, [r.eval_pass_at_1 or 0.0 for r in done], "eval pass@1 (producers)")]
    if k > 1:
        out.append((xs, [r.eval_pass_at_k or 0.0 for r in done], f"eval pass@{k} (producers)"))
    return out

"""What a run shows its user beyond metrics.jsonl: loggers and the completions it keeps."""

from __future__ import annotations

from dataclasses import dataclass

from common.config.fields import _f, failed

LOGGERS = ("tensorboard", "wandb")  # the values of log.report_to (consumer/loggers/)


@dataclass(frozen=True, slots=True)
class LogConfig:
    """`[log]`: experiment trackers and the completions kept in the run directory."""

    report_to: list[str] = _f(
        [],
        "Experiment trackers that get every metric (namespaced, step = policy version), the "
        "config and sample completions: 'tensorboard' (event files under RUN/tensorboard/; "
        "pip extra `tensorboard`), 'wandb' (WANDB_MODE and the other WANDB_* variables apply; "
        "pip extra `wandb`). Off by default; a failing tracker is reported once and dropped.",
    )
    project: str = _f("asyncgrpo", "The W&B project (unless WANDB_PROJECT says otherwise).")
    run_name: str = _f("", "The tracker's run name (default: the run directory's name).")
    completions_every: int = _f(
        10,
        "Steps between samples of completions written to RUN/completions.jsonl and sent to the "
        "trackers (0 = off).",
    )
    completions_groups: int = _f(2, "Groups (all their G completions) per completions sample.")

    def problems(self) -> list[str]:
        """This section's impossible settings (messages name the key)."""
        unknown = [name for name in self.report_to if name not in LOGGERS]
        return failed(
            (not unknown, f"log.report_to: {unknown} unknown; choose from {list(LOGGERS)}"),
            (len(set(self.report_to)) == len(self.report_to), "log.report_to names one twice"),
            (self.completions_every >= 0, "log.completions_every must be >= 0"),
            (self.completions_groups >= 1, "log.completions_groups must be >= 1"),
        )

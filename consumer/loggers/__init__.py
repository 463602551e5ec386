"""Experiment trackers and completions samples, on their own thread: nothing here can block or
end training.

- names.py: each metric's namespaced tracker name (`train/`, `rollout/`, `reward/`, ...);
- thread.py: `Loggers`, the thread that owns the trackers and completions.jsonl, fed through a
  bounded queue (`submit_*` never block: a full queue drops the item and counts it);
- tensorboard.py, wandb.py: the trackers `log.report_to` names, imported only on that thread
  (W&B in a spawned, niced process: child.py, so it takes no CPU or GIL from training).

`make_loggers(cfg, run_dir, model_dir)` checks at start that each named tracker's package is
installed (a `ConfigError` naming the pip extra) and starts the thread.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from common.config import Config
from common.errors import ConfigError
from consumer.loggers.thread import Loggers

_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


def make_loggers(cfg: Config, run_dir: Path, model_dir: Path | None) -> Loggers:
    """The started logger thread of this run (see the package docstring)."""
    for name in cfg.log.report_to:
        if importlib.util.find_spec(_PACKAGES[name]) is None:
            raise ConfigError(
                f"log.report_to names {name!r}, whose package is not installed: "
                f"pip install 'asyncgrpo[{name}]' (or drop it from log.report_to / --report-to)"
            )
    loggers = Loggers(cfg, run_dir, model_dir)
    loggers.start()
    return loggers


__all__ = ["Loggers", "make_loggers"]

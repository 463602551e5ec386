"""The typed configuration tree: defaults, units, help text, TOML, `--set`, validation.

One `Config` of frozen section dataclasses, each section beside its own checks:
- `fields.py`: how a field is declared (`_f`: default and help, written once and reused by
  `--help`, `asyncgrpo config show` and docs/config.md from `asyncgrpo config docs`), the
  modes (`Literal` types such as `AdvScale`, `TISMode`, declared once: the loss and the engines
  use the same type, and its values are the choices `--help` lists and loading enforces);
- the sections, each with `problems()` listing its impossible settings: `run.py` (run, model,
  task, rewards), `training.py` (sampling, train, loss, staleness, dist), `transport.py`
  (snapshot, net), `producer.py` (producer, fake, vllm), `observe.py` (log), `evaluation.py`
  (eval: evaluation during training through the producers), `episodes.py` (episodes: multi-turn
  environments);
- `tree.py`: `Config`, `problems` / `validate` over all sections, `field_help`;
- `load.py`: defaults < a TOML file (`load`) < `--set section.key=value` text
  (`apply_overrides`) < typed values from code and flags (`override`); `load_given` also
  returns the keys the user gave; `to_toml` / `write`.
`validate` refuses impossible settings with a message that names the key to change.
Endpoint rules (loopback, `tcp://HOST:PORT`) live in common/net/endpoints.py.

Everything is importable from `common.config` itself (`from common.config import Config`).
"""

from __future__ import annotations

from common.config.episodes import EpisodesConfig
from common.config.evaluation import EvalConfig
from common.config.fields import (
    AdvBaseline,
    AdvScale,
    AggMode,
    EngineName,
    EvalMode,
    KLKind,
    LearnerAttention,
    ModelDtype,
    Objective,
    PromptFormat,
    RatioLevel,
    ReduceDtype,
    SnapshotDtype,
    SnapshotFsync,
    TaskSource,
    TISLevel,
    TISMode,
    choices,
)
from common.config.fields import _f as _f
from common.config.load import (
    Loaded,
    apply_overrides,
    from_dict,
    load,
    load_given,
    override,
    to_dict,
    to_toml,
    write,
)
from common.config.observe import LOGGERS, LogConfig
from common.config.producer import FakeEngineConfig, ProducerConfig, VllmConfig
from common.config.run import ModelConfig, RewardsConfig, RewardSpec, RunConfig, TaskConfig
from common.config.training import (
    DistConfig,
    LossConfig,
    SamplingConfig,
    StalenessConfig,
    TrainConfig,
)
from common.config.transport import NetConfig, SnapshotConfig
from common.config.tree import CHECK_ORDER, SECTIONS, Config, field_help, problems, validate
from common.config.tree import _section_types as _section_types
from common.errors import ConfigError
from common.net.endpoints import endpoint_problem, is_loopback

__all__ = [
    "CHECK_ORDER",
    "LOGGERS",
    "SECTIONS",
    "AdvBaseline",
    "AdvScale",
    "AggMode",
    "Config",
    "ConfigError",
    "DistConfig",
    "EngineName",
    "EpisodesConfig",
    "EvalConfig",
    "EvalMode",
    "FakeEngineConfig",
    "KLKind",
    "LearnerAttention",
    "Loaded",
    "LogConfig",
    "LossConfig",
    "ModelConfig",
    "ModelDtype",
    "NetConfig",
    "Objective",
    "ProducerConfig",
    "PromptFormat",
    "RatioLevel",
    "ReduceDtype",
    "RewardSpec",
    "RewardsConfig",
    "RunConfig",
    "SamplingConfig",
    "SnapshotConfig",
    "SnapshotDtype",
    "SnapshotFsync",
    "StalenessConfig",
    "TISLevel",
    "TISMode",
    "TaskConfig",
    "TaskSource",
    "TrainConfig",
    "VllmConfig",
    "apply_overrides",
    "choices",
    "endpoint_problem",
    "field_help",
    "from_dict",
    "is_loopback",
    "load",
    "load_given",
    "override",
    "problems",
    "to_dict",
    "to_toml",
    "validate",
    "write",
]

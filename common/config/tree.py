"""The whole tree: one `Config` of the frozen sections, its checks as a whole, its help rows.

Each section lists its own impossible settings (`problems()`, beside its fields); `problems`
here gathers them in `CHECK_ORDER`, the order users see them in (the first is the one
`validate` raises), then the few checks that read several sections (`_across`, and
`_message_problems`: the largest control messages a producer's leases make must fit a message).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any

from common.config.episodes import EpisodesConfig
from common.config.evaluation import EvalConfig, eval_slots
from common.config.fields import choices, failed
from common.config.observe import LogConfig
from common.config.producer import FakeEngineConfig, ProducerConfig, VllmConfig
from common.config.run import ModelConfig, RewardsConfig, RunConfig, TaskConfig
from common.config.training import (
    DistConfig,
    LossConfig,
    SamplingConfig,
    StalenessConfig,
    TrainConfig,
)
from common.config.transport import NetConfig, SnapshotConfig
from common.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Config:
    """The configuration: one frozen section per TOML table (`[run]`, `[model]`, ...)."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    staleness: StalenessConfig = field(default_factory=StalenessConfig)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    net: NetConfig = field(default_factory=NetConfig)
    producer: ProducerConfig = field(default_factory=ProducerConfig)
    fake: FakeEngineConfig = field(default_factory=FakeEngineConfig)
    vllm: VllmConfig = field(default_factory=VllmConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    log: LogConfig = field(default_factory=LogConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    episodes: EpisodesConfig = field(default_factory=EpisodesConfig)


SECTIONS: dict[str, type[Any]] = {f.name: f.type for f in dataclasses.fields(Config)}  # type: ignore[misc]
# The sections in the order their problems are reported (every section, once).
CHECK_ORDER = (
    "sampling",
    "staleness",
    "train",
    "run",
    "loss",
    "task",
    "rewards",
    "snapshot",
    "net",
    "producer",
    "dist",
    "fake",
    "model",
    "vllm",
    "log",
    "eval",
    "episodes",
)


def _section_types() -> dict[str, type[Any]]:
    hints = typing.get_type_hints(Config)
    return {name: hints[name] for name in SECTIONS}


def validate(cfg: Config) -> None:
    """Raise `ConfigError` naming the key for every impossible setting (first one found)."""
    for problem in problems(cfg):
        raise ConfigError(problem)


def problems(cfg: Config) -> list[str]:
    """Every impossible setting, as a message that names the key and says why: each section's
    own, then those that span sections."""
    own = [message for name in CHECK_ORDER for message in getattr(cfg, name).problems()]
    return own + _across(cfg) + ([] if own else _message_problems(cfg))


def _across(cfg: Config) -> list[str]:
    """The checks that read more than one section."""
    return failed(
        (
            cfg.train.lr_schedule == "constant" or cfg.run.steps > 0,
            f"train.lr_schedule = {cfg.train.lr_schedule!r} decays over run.steps: set run.steps "
            "> 0, or use lr_schedule = 'constant'",
        ),
        (
            cfg.task.max_row_kib * 1024 <= cfg.net.max_message_mib * (1 << 20) / 2,
            f"task.max_row_kib = {cfg.task.max_row_kib:g} KiB: a lease grant carries rows in one "
            f"message of at most net.max_message_mib = {cfg.net.max_message_mib:g} MiB; keep "
            "rows to half of it",
        ),
        (
            not cfg.eval.on or bool(cfg.eval.path) or cfg.task.source == "synthetic",
            f"eval.every_steps = {cfg.eval.every_steps}: task.source = {cfg.task.source!r} has "
            "no held-out split; give its rows with eval.path (read like task.path)",
        ),
        (
            cfg.loss.overlong_window <= cfg.sampling.max_new_tokens,
            f"loss.overlong_window = {cfg.loss.overlong_window} > sampling.max_new_tokens = "
            f"{cfg.sampling.max_new_tokens}: the window is the last tokens before the limit",
        ),
    )


def _message_problems(cfg: Config) -> list[str]:
    """A producer holds at most min(producer.max_in_flight, (staleness.max_staleness + 1) x
    train.prompts_per_step) training leases (the consumer keeps no more open), and with
    evaluation on up to `eval_slots(...)` eval leases besides: its registration names
    them all, a grant carries up to 1,024 of them. Both must fit one control message
    (common/wire/sizes.py): at most `MAX_LEASE_IDS` ids, and `net.max_message_mib`."""
    from common.wire import sizes  # the wire's sizes, imported only when checked

    open_leases = (cfg.staleness.max_staleness + 1) * cfg.train.prompts_per_step
    held = min(cfg.producer.max_in_flight, open_leases)
    which = (
        f"producer.max_in_flight = {cfg.producer.max_in_flight}"
        if held == cfg.producer.max_in_flight
        else f"(staleness.max_staleness + 1) x train.prompts_per_step = {open_leases}"
    )
    if cfg.eval.on:  # eval leases come on top of the training slots (producer/pins.py)
        slots = eval_slots(
            cfg.producer.max_in_flight, cfg.sampling.group_size, cfg.eval.samples_per_prompt
        )
        held += slots
        which += f" (plus {slots} eval leases: eval.every_steps is on)"
    if held > sizes.MAX_LEASE_IDS:
        return [
            f"{which}: a producer would hold {held} leases, and one registration names at most "
            f"{sizes.MAX_LEASE_IDS}; lower it"
        ]
    need = sizes.largest_message_bytes(held)
    if need > cfg.net.max_message_mib * (1 << 20):
        return [
            f"net.max_message_mib = {cfg.net.max_message_mib:g} is too small for {which}: "
            f"the control messages of {held} leases take up to {need / (1 << 20):.3f} MiB before "
            "their prompts' text; raise net.max_message_mib above that"
        ]
    return []


def field_help() -> list[tuple[str, str, Any, str]]:
    """(key, type, default, help) for every field, in declaration order."""
    defaults = Config()
    return [row for name in _section_types() for row in _rows(name, getattr(defaults, name))]


def _rows(prefix: str, section: Any) -> list[tuple[str, str, Any, str]]:
    """The help rows of one section; a nested table's keys as `prefix.table.key`."""
    rows = []
    hints = typing.get_type_hints(type(section))
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if dataclasses.is_dataclass(value):  # a nested table: [model.lora]
            rows += _rows(f"{prefix}.{f.name}", value)
            continue
        help_text = f.metadata.get("help", "")
        allowed = choices(hints[f.name])
        if allowed:
            help_text += " One of: " + ", ".join(map(str, allowed)) + "."
        tp = type(allowed[0]) if allowed else hints[f.name]
        tname = getattr(tp, "__name__", str(tp))
        rows.append((f"{prefix}.{f.name}", tname, value, help_text))
    return rows

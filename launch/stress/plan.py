"""A staleness sweep's plan: what it varies and what its settings' configs are.

`Sweep` is what every setting of one sweep shares (engine, steps, the injected `Scenario`,
placements, the keys the user gave), `Setting` one run of it (max_staleness, producers, IS
mode, seed; `settings` orders them, each synchronous baseline first), and `build_config` the
setting's config: the user's own with only what the setting varies overridden. Pure: nothing
here starts a process or touches a file.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

from common import config as C
from common.errors import ConfigError
from launch.placement import Placement

# "off", then every TIS level-mode pair of the config ("token-truncate", ...).
IS_MODES = (
    "off",
    *(f"{level}-{mode}" for level in get_args(C.TISLevel) for mode in get_args(C.TISMode)),
)


# The GRPO family's variants a sweep can compare (`--variant`; docs/loss.md): each a set of
# `[loss]` overrides of the config's own loss ("config": none). "grpo" spells out the defaults.
VARIANTS: dict[str, dict[str, object]] = {
    "config": {},
    "grpo": {
        "loss.objective": "ppo",
        "loss.ratio_level": "token",
        "loss.adv_baseline": "group",
        "loss.adv_scale": "group",
        "loss.overlong_window": 0,
    },
    "gspo": {
        "loss.ratio_level": "sequence",
        "loss.agg": "seq-mean-token-mean",
        "loss.clip_low": 3e-4,
        "loss.clip_high": 4e-4,
    },
    "gmpo": {"loss.objective": "gmpo", "loss.clip_low": 0.4, "loss.clip_high": 0.4},
    "cispo": {"loss.objective": "cispo", "loss.clip_low": 1.0, "loss.clip_high": 4.0},
    "rloo": {"loss.adv_baseline": "leave-one-out", "loss.adv_scale": "none"},
    "reinforce++": {"loss.adv_baseline": "group-whiten", "loss.adv_scale": "none"},
    # clip-higher, token-mean and the soft overlong punishment over the last fifth (at least
    # one token) of sampling.max_new_tokens (the paper: 4,096 of 20,480)
    "dapo": {"loss.clip_high": 0.28, "loss.agg": "token-mean", "loss.overlong_window": -5},
}


def variant_overrides(variant: str, base: C.Config) -> dict[str, object]:
    """The `[loss]` overrides of a `VARIANTS` entry for `base` (an overlong window of -k: the
    last 1/k of `sampling.max_new_tokens`, at least one token)."""
    values = dict(VARIANTS[variant])
    window = values.get("loss.overlong_window")
    if isinstance(window, int) and window < 0:
        values["loss.overlong_window"] = max(1, base.sampling.max_new_tokens // -window)
    return values


# The fake engine's sweep, where the config does not say otherwise (keys the user gave, in their
# config or with --set, are kept): a simulated learner step and one group's generation of 0.5 s
# each, 8 leases per producer (the staleness bound still caps them). The rest of its scenario
# (`fake.jitter`, `fake.long_tail`, `snapshot.delay_s`, ...) is the config's.
FAKE_DEFAULTS: dict[str, object] = {
    "train.simulate_step_s": 0.5,
    "fake.latency_s": 0.5,
    "producer.max_in_flight": 8,
}


def with_fake_defaults(base: C.Config, given: frozenset[str]) -> C.Config:
    """`base` with `FAKE_DEFAULTS` for the keys the user did not give."""
    return C.override(base, {k: v for k, v in FAKE_DEFAULTS.items() if k not in given})


@dataclass(frozen=True)
class Scenario:
    """Faults injected into one producer of every setting of a sweep."""

    slow_factor: float = 1.0  # producer p1 generates this many times slower
    stall_s: float = 0.0  # producer p2 stalls this long after stall_after_s
    stall_after_s: float = 5.0
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Setting:
    """One run of the sweep."""

    ms: int  # staleness.max_staleness
    producers: int
    is_mode: str  # an IS_MODES entry
    seed: int
    variant: str = "config"  # a VARIANTS entry

    @property
    def name(self) -> str:
        loss = "" if self.variant == "config" else f"-{self.variant}"
        return f"ms{self.ms}-p{self.producers}-{self.is_mode}-s{self.seed}{loss}"

    def describe(self) -> str:
        """What the setting varies, for progress lines: `max_staleness 2, seed 0, 2 producers,
        IS off`."""
        return (
            f"max_staleness {self.ms}, seed {self.seed}, {self.producers} producer"
            f"{'s' if self.producers != 1 else ''}, IS {self.is_mode}"
            + ("" if self.variant == "config" else f", loss {self.variant}")
        )

    def sync(self) -> Setting:
        """The synchronous setting this one is compared with at equal wall-clock."""
        return Setting(0, self.producers, self.is_mode, self.seed, self.variant)


@dataclass(frozen=True)
class Sweep:
    """What is the same for every setting of one sweep."""

    engine: str  # fake, hf or vllm
    steps: int  # optimizer steps per setting (equal steps)
    scenario: Scenario = field(default_factory=Scenario)
    target_reward: float | None = None
    external: int = 0  # producers started elsewhere (0 = local producers)
    bind: str = ""  # external: host:port every setting's consumer binds
    placements: dict[int, Placement] = field(default_factory=dict)  # local: by producer count
    heldout: bool = True  # score snapshots on the held-out split (when the config has one)
    given: frozenset[str] = frozenset()  # keys the user set (kept over the cores rule)
    named: str = ""  # the engine as the user named it, when another name (`demo` runs `hf`)

    @property
    def engine_name(self) -> str:
        """The engine as results.csv records it: `--engine demo` is `demo`, not the `hf`
        engine it runs."""
        return self.named or self.engine


def settings(
    staleness: list[int],
    producers: list[int],
    is_modes: list[str],
    seeds: list[int],
    variants: tuple[str, ...] = ("config",),
) -> list[Setting]:
    """Every combination, each synchronous baseline before the settings compared with it."""
    ordered = sorted(dict.fromkeys(staleness), key=lambda ms: ms != 0)
    combos = itertools.product(seeds, variants, producers, is_modes, ordered)
    return [Setting(ms, n, mode, seed, variant) for seed, variant, n, mode, ms in combos]


def is_label(cfg: C.Config) -> str:
    """The IS mode a config already has ("off", "token-truncate", ...)."""
    return f"{cfg.loss.tis_level}-{cfg.loss.tis_mode}" if cfg.loss.tis else "off"


def is_overrides(is_mode: str) -> dict[str, object]:
    if is_mode == "off":
        return {"loss.tis": False}
    level, mode = is_mode.split("-")
    return {"loss.tis": True, "loss.tis_level": level, "loss.tis_mode": mode}


def build_config(
    base: C.Config,
    *,
    ms: int,
    is_mode: str,
    engine: str,
    steps: int,
    sc: Scenario,
    run_dir: Path,
    open_ended: bool = False,
    wait_for: int = 0,
    bind: str = "",
    variant: str = "config",
) -> C.Config:
    """One setting's config. `open_ended`: no step limit (the sweep stops the run once it has
    taken `steps` steps and run as long as the synchronous setting); `wait_for`: producers the
    consumer waits for before its first lease; `bind`: a fixed host:port (external producers);
    `variant`: a `VARIANTS` entry. Torch threads are left to the host's core board
    (common/host/core_board.py) unless the user set them."""
    values: dict[str, object] = {
        "staleness.max_staleness": ms,
        "run.steps": 0 if open_ended else steps,
        "run.seed": sc.seed,
        "run.dir": run_dir,
        "run.resume": False,
        "net.control_port": 0,
        "run.wait_for_producers": wait_for,
        "producer.engine": engine,
        **is_overrides(is_mode),
        **variant_overrides(variant, base),
    }
    if base.staleness.publish_every > ms + 1:
        values["staleness.publish_every"] = ms + 1  # the tightest bound the config allows
    if bind:
        host, _, port = bind.removeprefix("tcp://").rpartition(":")
        values |= {"net.bind_host": host, "net.control_port": int(port)}
    return C.override(base, values)


def producer_args(index: int, sc: Scenario) -> list[str]:
    """Per-producer injections: p1 is the slow one, p2 the one that stalls."""
    args: list[str] = []
    if index == 0 and sc.slow_factor != 1.0:
        args += ["--set", f"producer.slow_factor={sc.slow_factor}"]
    if index == 1 and sc.stall_s > 0:
        args += [
            "--set",
            f"producer.stall_s={sc.stall_s}",
            "--set",
            f"producer.stall_after_s={sc.stall_after_s}",
        ]
    return args


def check_settings(base: C.Config, sweep: Sweep, todo: list[Setting]) -> None:
    """Every setting's config is valid (a `ConfigError` naming the first that is not), before
    anything starts."""
    if not todo:
        raise ConfigError("no setting to run: give --max-staleness, --seeds and --producers")
    if sweep.steps < 1:
        raise ConfigError("--steps must be >= 1")
    if sweep.external:
        host, _, port = sweep.bind.removeprefix("tcp://").rpartition(":")
        if not host or not port.isdigit() or int(port) == 0:
            raise ConfigError(f"--bind: expected HOST:PORT with a fixed port, got {sweep.bind!r}")
    for s in todo:
        try:
            C.validate(
                build_config(
                    base,
                    ms=s.ms,
                    is_mode=s.is_mode,
                    engine=sweep.engine,
                    steps=sweep.steps,
                    sc=sweep.scenario,
                    run_dir=Path("."),
                    bind=sweep.bind,
                    variant=s.variant,
                )
            )
        except ConfigError as exc:
            raise ConfigError(f"setting {s.name}: {exc}") from None


# How one setting is run (launch/stress/setting.py `make_runner`): its row, or None once the
# stop event is set (Ctrl-C).
RunSetting = Callable[[Setting, Path, "float | None", threading.Event], "dict[str, Any] | None"]

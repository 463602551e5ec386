"""`asyncgrpo stress`: a sweep of real pipeline runs under different staleness settings
(launch/stress/: the plan, the run, the rows). Here: the options, read into the sweep's plan."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from common import config as C
from common.errors import ConfigError
from launch.cli.app import (
    EXIT_INTERRUPTED,
    ConfigOpt,
    EnvOpt,
    InsecureOpt,
    KeysOpt,
    SetOpt,
    demo_config,
    fail,
    load_given,
    resolve_model,
)

EPILOG = (
    "Examples. Transport and scheduling only (about 3 minutes):\n\n"
    "`asyncgrpo stress --out runs/sweep --max-staleness 0,1,2,4 --engine fake --steps 30`\n\n"
    "With learning (the demo model; about a minute per setting):\n\n"
    "`asyncgrpo stress --out runs/sweep-demo --engine demo --max-staleness 0,1,2,4 --steps 300`"
    "\n\nMulti-turn episodes with a heavy-tailed environment latency (docs/episodes.md):\n\n"
    "`asyncgrpo stress --out runs/sweep-guess --engine demo --env guess --max-staleness 0,2 "
    "--set episodes.latency_s=0.02`"
    "\n\nYour own model, task and rewards, three seeds, GPUs 1-3 for producers:\n\n"
    "`asyncgrpo stress --out runs/mine --config mine.toml --engine vllm --max-staleness 0,2,4 "
    "--seeds 0,1,2 --learner-gpus 0 --producer-gpus 1,2,3 --target-reward 0.6`\n\n"
    "Producers on other hosts (each started once: `asyncgrpo producer --follow --connect "
    "tcp://HOST:5555 --keys DIR`):\n\n"
    "`asyncgrpo stress --out runs/hosts --config mine.toml --engine vllm "
    "--external-producers 4 --bind 0.0.0.0:5555 --keys DIR`"
)

# The options, each with its help (the order of `stress`'s parameters is the order --help shows).
_Out = Annotated[
    Path, typer.Option(help="Sweep directory: results.csv, summary.md, plots/, runs/SETTING/.")
]
_MaxStaleness = Annotated[
    str, typer.Option(help="Comma-separated max_staleness values; 0 is the synchronous baseline.")
]
_Producers = Annotated[
    str,
    typer.Option(
        help="Comma-separated producer counts (default: 2 on a CPU, one per GPU the learner "
        "does not use)."
    ),
]
_IsModes = Annotated[
    str,
    typer.Option(
        "--is",
        help="Comma-separated IS corrections: off, token-truncate, token-mask, "
        "sequence-truncate, sequence-mask (default: the config's loss.tis*).",
    ),
]
_Variants = Annotated[
    str,
    typer.Option(
        "--variant",
        help="Comma-separated loss variants to sweep (docs/loss.md): config (the config's own "
        "loss), grpo, gspo, gmpo, cispo, rloo, reinforce++, dapo.",
    ),
]
_Engine = Annotated[
    str,
    typer.Option(
        help="fake (scheduling only, no learning), hf or vllm (the config's model learns), "
        "demo (hf on the embedded demo config unless --config is given)."
    ),
]
_Steps = Annotated[int, typer.Option(help="Optimizer steps per setting.")]
_Seeds = Annotated[
    str,
    typer.Option(
        help="Comma-separated seeds; every setting runs once per seed (prompt order, "
        "initialisation, each lease's sampling seed). A max_staleness = 0 setting repeats its "
        "tokens and rewards (weights to float rounding); in asynchronous ones which "
        "weights sample which group follows timing."
    ),
]
_TargetReward = Annotated[
    float | None,
    typer.Option(help="Report the time and steps each setting takes to reach this reward."),
]
_Resume = Annotated[
    bool, typer.Option("--resume", help="Finish an interrupted sweep: skip finished settings.")
]
_Force = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Start a new sweep in an --out that holds another one (deletes its sweep.json, "
        "runs/, results.csv, summary.md and plots/).",
    ),
]
_External = Annotated[
    int,
    typer.Option(
        help="Run no producers here: wait for this many `asyncgrpo producer --follow` "
        "started elsewhere before each setting starts."
    ),
]
_Bind = Annotated[
    str, typer.Option(help="host:port every setting's consumer binds (--external-producers).")
]
_LearnerGpus = Annotated[
    str, typer.Option(help="The learner's GPU (default: the first no producer was given).")
]
_ProducerGpus = Annotated[
    str,
    typer.Option(
        help="One producer per listed GPU (list one twice for two); default: every GPU "
        "but the learner's, or beside the learner on a single GPU."
    ),
]
_Colocated = Annotated[
    float, typer.Option(help="vLLM's share of a GPU it shares with the learner.")
]
_Heldout = Annotated[
    bool,
    typer.Option(
        "--heldout/--no-heldout",
        help="Score each setting's snapshots on the held-out split (eval.path, or the "
        "synthetic task's) at equal steps and equal wall-clock.",
    ),
]
_Slow = Annotated[float, typer.Option(help="Producer p1 generates this many times slower.")]
_StallS = Annotated[float, typer.Option(help="Producer p2 stalls this long, 5 s after it starts.")]


def stress(
    out: _Out,
    max_staleness: _MaxStaleness = "0,1,2,4",
    producers: _Producers = "",
    is_modes: _IsModes = "",
    variants: _Variants = "config",
    engine: _Engine = "fake",
    steps: _Steps = 30,
    seeds: _Seeds = "0",
    target_reward: _TargetReward = None,
    resume: _Resume = False,
    force: _Force = False,
    external_producers: _External = 0,
    bind: _Bind = "127.0.0.1:5555",
    learner_gpus: _LearnerGpus = "",
    producer_gpus: _ProducerGpus = "",
    colocated_memory: _Colocated = 0.4,
    heldout: _Heldout = True,
    slow: _Slow = 1.0,
    stall_s: _StallS = 0.0,
    config: ConfigOpt = None,
    env: EnvOpt = None,
    set_: SetOpt = None,
    keys: KeysOpt = None,
    insecure: InsecureOpt = False,
) -> None:
    """Run a grid of real pipeline runs under different staleness settings and compare them.

    Each setting starts a consumer and producers as processes over ZeroMQ on your config (model,
    task, rewards, loss); results.csv has one row per setting and seed (throughput, idle
    fractions, staleness histogram, drops, TIS statistics, speedup over max_staleness = 0,
    reward and held-out score at equal steps and at the synchronous setting's wall-clock, time
    to --target-reward, placement, hosts). Ctrl-C keeps finished settings; --resume goes on.

    The fake engine's timings are config keys (--set train.simulate_step_s=0.5, fake.latency_s,
    fake.jitter, fake.long_tail, producer.max_in_flight, snapshot.delay_s): docs/stress.md.
    """
    from launch.placement import placements
    from launch.stress import plan as P
    from launch.stress.run import run_sweep

    modes, kind = _modes_and_engine(is_modes, engine)
    base, given = _base_config(kind, config, set_, keys, insecure, env)
    counts = _ints(producers, "--producers") or None
    scenario = P.Scenario(slow_factor=slow, stall_s=stall_s)
    try:
        where = (
            {}
            if external_producers
            else placements(
                engine=kind,
                producer_counts=counts,
                colocated_memory=colocated_memory,
                learner_gpus=_ints(learner_gpus, "--learner-gpus") or None,
                producer_gpus=_ints(producer_gpus, "--producer-gpus") or None,
            )
        )
        sweep = P.Sweep(
            engine=kind,
            named=engine if engine != kind else "",
            steps=steps,
            target_reward=target_reward,
            external=external_producers,
            bind=bind if external_producers else "",
            placements=where,
            heldout=heldout,
            given=given,
            scenario=scenario,
        )
        todo = P.settings(
            _ints(max_staleness, "--max-staleness"),
            [external_producers] if external_producers else list(where),
            modes or [P.is_label(base)],
            _ints(seeds, "--seeds"),
            _variants(variants),
        )
        P.check_settings(base, sweep, todo)
    except ConfigError as exc:
        fail(str(exc))
    if external_producers:
        _tell_external(external_producers, bind, keys)
    try:
        rows, interrupted = run_sweep(base, out, todo, sweep, resume=resume, force=force)
    except ConfigError as exc:  # a directory holding another sweep
        fail(str(exc))
    _finish(out, rows, interrupted)


def _variants(variants: str) -> tuple[str, ...]:
    """The --variant names given, checked."""
    from launch.stress.plan import VARIANTS

    names = tuple(dict.fromkeys(v.strip() for v in variants.split(",") if v.strip()))
    bad = [v for v in names if v not in VARIANTS]
    if bad:
        fail(f"--variant: unknown {bad}; choose from {', '.join(VARIANTS)}")
    return names or ("config",)


def _modes_and_engine(is_modes: str, engine: str) -> tuple[list[str], str]:
    """The --is modes given and the engine kind (`demo` is `hf`), both checked."""
    from launch.stress.plan import IS_MODES

    modes = [m.strip() for m in is_modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in IS_MODES]
    if bad:
        fail(f"--is: unknown {bad}; choose from {', '.join(IS_MODES)}")
    if engine not in ("fake", "demo", "hf", "vllm"):
        fail("--engine must be fake, demo, hf or vllm")
    return modes, "hf" if engine == "demo" else engine


def _tell_external(num: int, bind: str, keys: Path | None) -> None:
    typer.echo(
        f"each setting waits for {num} producers: start them (once) with "
        f"`asyncgrpo producer --follow --connect tcp://{bind}`"
        + (f" --keys {keys}" if keys else ""),
        err=True,
    )


def _base_config(
    kind: str,
    config: Path | None,
    sets: list[str] | None,
    keys: Path | None,
    insecure: bool,
    env: str | None = None,
) -> tuple[C.Config, frozenset[str]]:
    """The config every setting starts from (the demo's unless --config, for a learning
    engine; the multi-turn demo's with --env guess), its model directory made ready; and the
    keys the user gave."""
    flags: dict[str, object] = {
        "net.keys_dir": keys,
        "net.insecure": insecure or None,
        "episodes.env": env,
    }
    fallback = None if kind == "fake" else demo_config(env)
    base, given = load_given(config, sets, flags, fallback=fallback)
    if kind == "fake":
        from launch.stress.plan import with_fake_defaults

        return with_fake_defaults(base, given), given
    base = C.override(base, {"model.path": resolve_model(base.model.path)})
    return base, given


def _finish(out: Path, rows: list[dict[str, Any]], interrupted: bool) -> NoReturn:
    """Print each setting's line and where the results are; exit 130 when interrupted, 1 when
    a setting failed."""
    from launch.stress.results import row_line

    for r in rows:
        typer.echo(row_line(r))
    typer.echo(f"wrote {out / 'results.csv'}, {out / 'summary.md'} and {out / 'plots'}")
    if interrupted:
        typer.echo("interrupted: run the same command with --resume to finish", err=True)
        raise typer.Exit(EXIT_INTERRUPTED)
    raise typer.Exit(1 if any(r["status"] != "ok" for r in rows) else 0)


def _ints(text: str, name: str) -> list[int]:
    """A comma-separated list of integers given to option `name`."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"{name} expects comma-separated integers, got {text!r}")

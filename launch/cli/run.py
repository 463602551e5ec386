"""`asyncgrpo launch`, `consumer` and `producer`: the processes of a run.

A run is prepared once, by whoever starts it: its directory claimed (one holding another run
needs --resume or --force), the model directory made ready (the demo model is built the first
time) and the resolved config written to RUN_DIR/config.toml (`prepare_run`). `launch` prepares
it and starts its consumer with `--prepared` (launch/local.py): that consumer takes the written
config as it is and neither claims the directory nor resolves the model again. A consumer
started by hand prepares its own run; under torchrun rank 0 prepares it and the other ranks take
the run directory and the model from rank 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from common import config as C
from common.errors import EXIT_CONFIG, EXIT_CONSUMER_LOST, ConfigError
from common.files import run_files as RF
from launch.cli.app import (
    EXIT_INTERRUPTED,
    ConfigOpt,
    EngineOpt,
    EnvOpt,
    ForceOpt,
    InsecureOpt,
    KeysOpt,
    MaxStalenessOpt,
    ModelOpt,
    NewRunDir,
    ReportToOpt,
    ResumeOpt,
    SetOpt,
    StepsOpt,
    VerboseOpt,
    demo_config,
    discard_failed_start,
    fail,
    load_config,
    load_given,
    new_run_dir,
    report_to,
    resolve_model,
    resumed_config,
    setup_logging,
)


def prepare_run(cfg: C.Config, out: Path, values: dict[str, object] | None = None) -> C.Config:
    """`cfg` for the run in `out` (already claimed): `run.dir = out`, the model directory made
    ready (unless the learner step is simulated) and `values`; written to OUT/config.toml, the
    config every process of the run reads."""
    resolved: dict[str, object] = {"run.dir": out, **(values or {})}
    if not cfg.train.simulate_step_s:
        resolved["model.path"] = resolve_model(cfg.model.path)
    cfg = C.override(cfg, resolved)
    if cfg.model.lora.enabled and not cfg.train.simulate_step_s:  # a target it lacks: refused
        from common.errors import ConfigError
        from consumer.train.adapter import check_model

        try:
            check_model(cfg.model.lora, Path(cfg.model.path))
        except ConfigError as exc:
            fail(str(exc))
    C.write(cfg, out / RF.CONFIG)
    return cfg


def _consumer_run(cfg: C.Config, force: bool, prepared: bool) -> tuple[NewRunDir, C.Config]:
    """The run directory and the config of this consumer's run: as written when the launcher
    prepared it (`--prepared`: the launcher owns the directory), else prepared here."""
    if prepared:
        if not cfg.run.dir:
            fail("--prepared needs the run's own config.toml (run.dir is empty)")
        return NewRunDir(Path(cfg.run.dir), created=False), cfg
    with new_run_dir(cfg, force) as claimed:
        return claimed, prepare_run(cfg, claimed.path)


def _join_ranks(cfg: C.Config, force: bool, prepared: bool) -> tuple[Path, C.Config, str]:
    """Under torchrun: join the process group; rank 0 prepares the run directory and the model
    (the demo model is built once), the other ranks take both from it. Returns the run
    directory, the config and the log's name (consumer, consumer-rank1, ...)."""
    import json

    from common.host.device import resolve_device
    from consumer.train import ranks as D

    world = D.World.from_env()
    cuda = resolve_device(cfg.model.device).type == "cuda"
    D.init(world, cuda=cuda, timeout_s=cfg.dist.timeout_s)
    if world.main:
        claimed, cfg = _consumer_run(cfg, force, prepared)
        out = claimed.path
        D.share_text(json.dumps({"run.dir": str(out), "model.path": cfg.model.path}))
        return out, cfg, "consumer"
    values = json.loads(D.share_text(None))
    return Path(values["run.dir"]), C.override(cfg, values), f"consumer-rank{world.rank}"


def _exec_torchrun(nproc: int) -> None:
    """Become `torchrun --standalone --nproc-per-node N -m launch.cli consumer ...` (the same
    arguments, less --nproc-per-node)."""
    args, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
        elif arg == "--nproc-per-node":
            skip = True
        elif not arg.startswith("--nproc-per-node="):
            args.append(arg)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "launch.cli",
        *args,
    ]
    typer.echo(f"starting {nproc} learner processes: {' '.join(cmd[1:])}", err=True)
    sys.stderr.flush()
    os.execv(sys.executable, cmd)


CONSUMER_EPILOG = (
    "Example, one machine (then start producers with `asyncgrpo producer`):\n\n"
    "`asyncgrpo consumer --run-dir runs/mine --model demo --steps 200`\n\n"
    "Across machines (CurveZMQ keys from `asyncgrpo keys keys/`):\n\n"
    "`asyncgrpo consumer --bind 0.0.0.0 --keys keys/ --model /models/qwen`\n\n"
    "Sharded over 4 GPUs of this machine (FSDP2 under torchrun):\n\n"
    "`asyncgrpo consumer --nproc-per-node 4 --model /models/qwen`\n\n"
    "Every config key: `asyncgrpo config show`."
)
NprocOpt = Annotated[
    int,
    typer.Option(
        "--nproc-per-node",
        help="Learner processes on this machine: N > 1 starts `torchrun --standalone "
        "--nproc-per-node N` with the other arguments (one policy sharded with FSDP2, one GPU "
        "per process on CUDA). Several machines: start torchrun yourself (docs/running.md).",
    ),
]
# Not in --help: the launcher's consumers (launch/local.py) take their run as it was prepared.
PreparedOpt = Annotated[bool, typer.Option("--prepared", hidden=True)]


def consumer(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run_dir: Annotated[
        str | None,
        typer.Option("--run-dir", help="run.dir: where metrics, ledger and snapshots go."),
    ] = None,
    steps: StepsOpt = None,
    model: ModelOpt = None,
    max_staleness: MaxStalenessOpt = None,
    bind: Annotated[str | None, typer.Option(help="net.bind_host: address to listen on.")] = None,
    advertise: Annotated[
        str | None,
        typer.Option(
            help="net.advertise_host: the host endpoints.json names for producers (default: "
            "the --bind address, or this host's name for 0.0.0.0 or ::)."
        ),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="net.control_port: the port producers --connect to.")
    ] = None,
    keys: KeysOpt = None,
    insecure: InsecureOpt = False,
    resume: ResumeOpt = False,
    force: ForceOpt = False,
    nproc_per_node: NprocOpt = 1,
    report_to_: ReportToOpt = None,
    verbose: VerboseOpt = False,
    prepared: PreparedOpt = False,
) -> None:
    """Run the learner: lease prompts, receive groups, train, publish snapshots."""
    flags = {
        "run.dir": run_dir,
        "run.steps": steps,
        "model.path": model,
        "staleness.max_staleness": max_staleness,
        "net.bind_host": bind,
        "net.control_port": port,
        "net.advertise_host": advertise,
        "net.keys_dir": keys,
        "net.insecure": insecure or None,
        "run.resume": resume or None,
        "log.report_to": report_to(report_to_),
    }
    cfg = load_config(resumed_config(config, resume, run_dir), set_, flags)
    if nproc_per_node > 1 and "LOCAL_RANK" not in os.environ:
        _exec_torchrun(nproc_per_node)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        out, cfg, name = _join_ranks(cfg, force, prepared)
        claimed = NewRunDir(out, created=False)
    else:
        (claimed, cfg), name = _consumer_run(cfg, force, prepared), "consumer"
        out = claimed.path
    setup_logging(out, name, verbose)
    from consumer.learner import main as learner_main
    from launch.dashboard import Progress

    progress = Progress(out, cfg.run.steps)  # a line every 10 s (`asyncgrpo status` any time)
    if name == "consumer":  # rank 0 alone under torchrun
        progress.start()
    try:
        code = learner_main(cfg, out)
    except ConfigError as exc:  # it cannot start: one line, and no directory left behind
        progress.stop()
        discard_failed_start(claimed)
        fail(str(exc))
    finally:
        progress.stop()
    raise typer.Exit(code)


PRODUCER_EPILOG = (
    "The sampling settings, G, the rewards and the model come from the consumer.\n\n"
    "`asyncgrpo producer --connect tcp://127.0.0.1:5555 --engine hf`\n\n"
    "Across machines, with its own keys (`asyncgrpo keys keys/ --producer gpu1` on the "
    "consumer's host, then keys/producers/gpu1/ copied here):\n\n"
    "`asyncgrpo producer --connect tcp://10.0.0.1:5555 --keys keys/producers/gpu1 --id gpu1 "
    "--engine vllm`"
)
ConnectFileOpt = Annotated[
    str | None,
    typer.Option(
        help="net.connect_file: wait for a consumer's RUN_DIR/endpoints.json and connect "
        "to it (start producers before their consumer; shared filesystems)."
    ),
]
FollowOpt = Annotated[
    bool,
    typer.Option(
        "--follow",
        help="producer.follow: after a run, serve the next consumer at the same address "
        "(a sweep's --external-producers).",
    ),
]


def producer(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    connect: Annotated[
        str | None,
        typer.Option(help="net.connect: the consumer's control endpoint, tcp://HOST:PORT."),
    ] = None,
    connect_file: ConnectFileOpt = None,
    engine: EngineOpt = None,
    model: Annotated[
        str | None,
        typer.Option(help="producer.model: local model dir (default: the consumer's), or 'demo'."),
    ] = None,
    max_in_flight: Annotated[
        int | None,
        typer.Option(
            help="producer.max_in_flight: prompts held at once (default 4). launch gives each hf "
            "producer ceil((max_staleness + 1) * prompts_per_step / producers): that is the "
            "number to give a producer started by hand to match it."
        ),
    ] = None,
    producer_id: Annotated[
        str | None, typer.Option("--id", help="producer.id: name in logs and ledger.")
    ] = None,
    device: Annotated[str | None, typer.Option(help="producer.device for the hf engine.")] = None,
    follow: FollowOpt = False,
    keys: KeysOpt = None,
    insecure: InsecureOpt = False,
    log_file: Annotated[Path | None, typer.Option(help="Also log to this file.")] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Run a producer: sample groups for the consumer's leases; reload its snapshots."""
    flags = {
        "net.connect": connect,
        "net.connect_file": connect_file,
        "producer.engine": engine,
        "producer.model": model,
        "producer.max_in_flight": max_in_flight,
        "producer.id": producer_id,
        "producer.device": device,
        "net.keys_dir": keys,
        "net.insecure": insecure or None,
        "producer.follow": follow or None,
    }
    cfg = load_config(config, set_, flags)
    if cfg.producer.model == "demo":  # the embedded demo model, built on this host
        cfg = C.override(cfg, {"producer.model": resolve_model("demo")})
    setup_logging(None, "producer", verbose)
    if log_file is not None:
        logging.getLogger().addHandler(logging.FileHandler(log_file))
    from producer.endpoint_file import NoConsumer
    from producer.main import main as worker_main

    try:
        code = asyncio.run(worker_main(cfg))
    except NoConsumer as exc:  # a restart may find it: not a configuration error
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise typer.Exit(EXIT_CONSUMER_LOST) from None
    except ConfigError as exc:
        fail(str(exc))
    raise typer.Exit(code)


ProducersOpt = Annotated[
    int | None,
    typer.Option(
        help="Producer processes to start (default: hf producers by the cores rule, "
        "printed at start; 2 for other engines).",
        min=1,
    ),
]
LiveOpt = Annotated[
    bool | None,
    typer.Option("--live/--no-live", help="Live dashboard (default: when stderr is a terminal)."),
]
EvalOpt = Annotated[
    bool,
    typer.Option(
        "--eval/--no-eval", help="Evaluate the start and final models on the held-out split."
    ),
]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Train nothing: sample the task's first 4 prompts G times with the starting model, "
        "score them with the run's rewards and print each completion, its reward and each "
        "function's score (exit 3 when no prompt has a learning signal).",
    ),
]


def launch(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run_dir: Annotated[
        str | None, typer.Option("--run-dir", help="Run directory (default: runs/TIMESTAMP).")
    ] = None,
    steps: StepsOpt = None,
    model: ModelOpt = None,
    producers: ProducersOpt = None,
    engine: EngineOpt = None,
    env: EnvOpt = None,
    max_staleness: MaxStalenessOpt = None,
    live: LiveOpt = None,
    evaluate: EvalOpt = True,
    report_to_: ReportToOpt = None,
    resume: ResumeOpt = False,
    force: ForceOpt = False,
    dry_run: DryRunOpt = False,
) -> None:
    """Run the whole pipeline here: one consumer and N producers, supervised.

    Without --config it trains the embedded demo (a tiny model this project builds itself) on the
    synthetic arithmetic task (with --env guess, as multi-turn episodes: docs/episodes.md), shows
    live progress, evaluates the starting model and the final snapshot on the held-out split,
    and writes plots. Ctrl-C stops cleanly (final snapshot, then
    the summary; exit 130); a second Ctrl-C skips the final evaluation.
    """
    flags = {
        "run.dir": run_dir,
        "run.steps": steps,
        "producer.engine": engine,
        "episodes.env": env,
        "staleness.max_staleness": max_staleness,
        "model.path": model,
        "run.resume": resume or None,
        "log.report_to": report_to(report_to_),
    }
    file = resumed_config(config, resume, run_dir)
    cfg, given = load_given(file, set_, flags, fallback=demo_config(env))
    if dry_run:
        from launch.cli.dry_run import run_dry

        run_dry(cfg)
    check_rewards(cfg)
    from launch import local
    from launch.cli.finish import end_failed, finish

    with new_run_dir(cfg, force) as claimed:
        out = claimed.path
        cfg, producers = _split_cores(cfg, given, producers)
        cfg = local.local_config(cfg, given)
        if not cfg.train.simulate_step_s:
            typer.echo(f"model: {cfg.model.path}", err=True)
        cfg = prepare_run(cfg, out.resolve(), {"net.control_port": 0})
    model_dir = None if cfg.train.simulate_step_s else Path(cfg.model.path)
    typer.echo(f"run directory: {out}", err=True)
    show = sys.stderr.isatty() if live is None else live
    from consumer import evaluation

    evaluates = evaluate and model_dir is not None and evaluation.has_heldout(cfg)
    stopped, hurried = threading.Event(), threading.Event()
    sup = local.Supervisor(out, config_path=out / RF.CONFIG, num_producers=producers)
    again = "skip the final evaluation" if evaluates else ""
    code = local.run(
        sup,
        steps=cfg.run.steps,
        live=show,
        wording=local.Wording(again=again),
        stop_event=stopped,
        hurry_event=hurried,
    )
    if sup.failure is not None and code == EXIT_CONFIG:  # nothing to evaluate or report
        end_failed(claimed, code)
    finish(cfg, out, model_dir if evaluates and not hurried.is_set() else None)
    raise typer.Exit(EXIT_INTERRUPTED if stopped.is_set() and code == 0 else code)


def check_rewards(cfg: C.Config) -> None:
    """Before anything starts: every reward function imports here, where `launch`'s producers
    will run (a module that does not is one line and exit 2, not a producer restarted)."""
    if cfg.producer.engine == "fake":  # its rewards are coins
        return
    from producer.rewards.calls import resolve

    for spec in cfg.rewards.fns:
        try:
            resolve(spec.fn)
        except ConfigError as exc:
            fail(str(exc))


def _split_cores(
    cfg: C.Config, given: frozenset[str], producers: int | None
) -> tuple[C.Config, int]:
    """Producers and their leases by the cores rule (launch/cores.py) for hf producers, the keys
    the user gave kept; prints the plan (torch threads are shared on the host's core board
    unless given). Other engines: 2 producers unless given."""
    if cfg.producer.engine != "hf":
        return cfg, producers or 2
    from launch import cores

    chosen = cores.plan(
        cores.usable_cores(),
        max_staleness=cfg.staleness.max_staleness,
        prompts_per_step=cfg.train.prompts_per_step,
        producers=producers,
        step_costs=cores.estimate(cfg),
    )
    if "producer.max_in_flight" not in given:
        cfg = C.override(cfg, {"producer.max_in_flight": chosen.max_in_flight})
    shown = replace(chosen, max_in_flight=cfg.producer.max_in_flight)
    fixed = {
        "model.torch_threads": cfg.model.torch_threads,
        "producer.torch_threads": cfg.producer.torch_threads,
    }
    kept = (given & set(cores.KEYS)) | ({"producers"} if producers else set())
    typer.echo(cores.describe(shown, given=kept, fixed=fixed), err=True)
    return cfg, chosen.producers

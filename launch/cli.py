"""`asyncgrpo`: the command-line entry point (typer).

The flags people type live here; every other setting is a config key (TOML file via --config,
one-offs via --set section.key=value; `asyncgrpo config show` lists them all with their help).
Heavy imports (torch, transformers, vllm) happen inside command bodies, so `--help` is instant
and fake-engine producers never import torch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from common import config as C
from common.errors import ConfigError

app = typer.Typer(
    help=(
        "Asynchronous off-policy GRPO. A consumer (the learner) leases prompts to producers, which "
        "sample G completions per prompt, score them with verifiable rewards and stream the groups "
        "back over ZeroMQ; the learner trains with a TIS-corrected GRPO loss and publishes weight "
        "snapshots that producers reload. Start with `asyncgrpo launch` (the embedded demo)."
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="markdown",  # docstring paragraphs are re-flowed to the terminal width
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(help="Inspect the configuration keys.", no_args_is_help=True)
app.add_typer(config_app, name="config")

ConfigOpt = Annotated[
    Path | None,
    typer.Option("--config", "-c", help="TOML config file (see `asyncgrpo config show`)."),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override one key: section.key=value (repeatable)."),
]
KeysOpt = Annotated[
    Path | None, typer.Option("--keys", help="CurveZMQ keys directory (`asyncgrpo keys DIR`).")
]
InsecureOpt = Annotated[
    bool, typer.Option("--insecure", help="Allow non-loopback traffic without CurveZMQ.")
]


def load_config(config: Path | None, sets: list[str] | None, flags: dict[str, object]) -> C.Config:
    """Defaults < TOML file < --set < explicit flags (None = not given); validated. Flags are
    typed values (`C.override`): a path with quotes or backslashes arrives as written."""
    values = {k: v for k, v in flags.items() if v is not None}
    try:
        return C.load(config, sets or [], values)
    except ConfigError as exc:
        _fail(str(exc))
        raise AssertionError from exc  # unreachable


def _shown(v: object) -> str:
    """A default as the config table shows it (TOML syntax; dataclasses as inline tables)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_shown(x) for x in v) + "]"
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        fields = ", ".join(f"{k} = {_shown(x)}" for k, x in dataclasses.asdict(v).items())
        return "{" + fields + "}"
    return str(v)


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def setup_logging(run_dir: Path | None, name: str, verbose: bool = False) -> None:
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if run_dir is not None:
        handlers.append(logging.FileHandler(run_dir / f"{name}.log"))
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format=f"%(asctime)s {name} %(levelname)s %(message)s",
        handlers=handlers,
        force=True,
    )


def resolve_model(path: str) -> Path:
    """`model.path` as a local model directory: 'demo' is the embedded tiny model (built once
    into the cache, about 30 s), anything else must be a Hugging Face model directory."""
    if path == "demo":
        from launch.demo_model import ensure_demo_model

        return ensure_demo_model()
    from consumer.learner import local_model_dir

    try:
        return local_model_dir(path)
    except ConfigError as exc:
        _fail(str(exc))
        raise AssertionError from exc  # unreachable


def make_run_dir(cfg: C.Config, force: bool = False) -> Path:
    """The run directory, created; one holding another run needs --resume or --force."""
    from launch.run_dir import claim

    run_dir = Path(cfg.run.dir or f"runs/{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        return claim(run_dir, resume=cfg.run.resume, force=force)
    except ConfigError as exc:
        _fail(str(exc))
        raise AssertionError from exc  # unreachable


ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Start a new run in a run directory that holds another one (deletes its metrics, "
        "ledger, snapshots, checkpoints and logs).",
    ),
]


def _prepare_consumer_run(cfg: C.Config, force: bool) -> tuple[Path, C.Config]:
    """The run directory and the model directory made ready, the resolved config written."""
    out = make_run_dir(cfg, force)
    resolved: dict[str, object] = {"run.dir": out}
    if not cfg.train.simulate_step_s:
        resolved["model.path"] = resolve_model(cfg.model.path)
    cfg = C.override(cfg, resolved)
    C.write(cfg, out / "config.toml")
    return out, cfg


def _join_ranks(cfg: C.Config, force: bool) -> tuple[Path, C.Config, str]:
    """Under torchrun: join the process group; rank 0 prepares the run directory and the model
    (the demo model is built once), the other ranks take both from it. Returns the run
    directory, the config and the log's name (consumer, consumer-rank1, ...)."""
    import json

    from common.device import resolve_device
    from consumer import distributed as D

    world = D.World.from_env()
    cuda = resolve_device(cfg.model.device).type == "cuda"
    D.init(world, cuda=cuda, timeout_s=cfg.dist.timeout_s)
    if world.main:
        out, cfg = _prepare_consumer_run(cfg, force)
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
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", "-m", "launch.cli", *args]  # fmt: skip
    typer.echo(f"starting {nproc} learner processes: {' '.join(cmd[1:])}", err=True)
    sys.stderr.flush()
    os.execv(sys.executable, cmd)


@app.command(
    epilog=(
        "Example, one machine (then start producers with `asyncgrpo producer`):\n\n"
        "`asyncgrpo consumer --run-dir runs/mine --model demo --steps 200`\n\n"
        "Across machines (CurveZMQ keys from `asyncgrpo keys keys/`):\n\n"
        "`asyncgrpo consumer --bind 0.0.0.0 --keys keys/ --model /models/qwen`\n\n"
        "Sharded over 4 GPUs of this machine (FSDP2 under torchrun):\n\n"
        "`asyncgrpo consumer --nproc-per-node 4 --model /models/qwen`\n\n"
        "Every config key: `asyncgrpo config show`."
    )
)
def consumer(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run_dir: Annotated[
        str | None,
        typer.Option("--run-dir", help="run.dir: where metrics, ledger and snapshots go."),
    ] = None,
    steps: Annotated[int | None, typer.Option(help="run.steps: optimizer steps to take.")] = None,
    model: Annotated[
        str | None, typer.Option(help="model.path: HF model directory, or 'demo'.")
    ] = None,
    max_staleness: Annotated[
        int | None, typer.Option(help="staleness.max_staleness (0 = synchronous).")
    ] = None,
    bind: Annotated[str | None, typer.Option(help="net.bind_host: address to listen on.")] = None,
    port: Annotated[
        int | None, typer.Option(help="net.control_port: the port producers --connect to.")
    ] = None,
    keys: KeysOpt = None,
    insecure: InsecureOpt = False,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the run directory's checkpoint.")
    ] = False,
    force: ForceOpt = False,
    nproc_per_node: Annotated[
        int,
        typer.Option(
            "--nproc-per-node",
            help="Learner processes on this machine: N > 1 starts `torchrun --standalone "
            "--nproc-per-node N` with the other arguments (one policy sharded with FSDP2, one GPU "
            "per process on CUDA). Several machines: start torchrun yourself (README).",
        ),
    ] = 1,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at DEBUG level.")] = False,
) -> None:
    """Run the learner: lease prompts, receive groups, train, publish snapshots."""
    flags = {
        "run.dir": run_dir, "run.steps": steps, "model.path": model,
        "staleness.max_staleness": max_staleness, "net.bind_host": bind, "net.control_port": port,
        "net.keys_dir": keys, "net.insecure": insecure or None, "run.resume": resume or None,
    }  # fmt: skip
    cfg = load_config(config, set_, flags)
    if nproc_per_node > 1 and "LOCAL_RANK" not in os.environ:
        _exec_torchrun(nproc_per_node)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        out, cfg, name = _join_ranks(cfg, force)
    else:
        (out, cfg), name = _prepare_consumer_run(cfg, force), "consumer"
    setup_logging(out, name, verbose)
    from consumer.learner import main as learner_main
    from launch.dashboard import Progress

    progress = Progress(out, cfg.run.steps)  # a line every 10 s (`asyncgrpo status` any time)
    if name == "consumer":  # rank 0 alone under torchrun
        progress.start()
    try:
        code = learner_main(cfg, out)
    except ConfigError as exc:
        _fail(str(exc))
    finally:
        progress.stop()
    raise typer.Exit(code)


@app.command(
    epilog=(
        "The sampling settings, G, the rewards and the model come from the consumer.\n\n"
        "`asyncgrpo producer --connect tcp://127.0.0.1:5555 --engine hf`\n\n"
        "`asyncgrpo producer --connect tcp://10.0.0.1:5555 --keys keys/ --engine vllm`"
    )
)
def producer(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    connect: Annotated[
        str | None,
        typer.Option(help="net.connect: the consumer's control endpoint, tcp://HOST:PORT."),
    ] = None,
    connect_file: Annotated[
        str | None,
        typer.Option(
            help="net.connect_file: wait for a consumer's RUN_DIR/endpoints.json and connect "
            "to it (start producers before their consumer; shared filesystems)."
        ),
    ] = None,
    engine: Annotated[str | None, typer.Option(help="producer.engine: hf, vllm or fake.")] = None,
    model: Annotated[
        str | None,
        typer.Option(help="producer.model: local model dir (default: the consumer's), or 'demo'."),
    ] = None,
    max_in_flight: Annotated[
        int | None, typer.Option(help="producer.max_in_flight: prompts held at once.")
    ] = None,
    producer_id: Annotated[
        str | None, typer.Option("--id", help="producer.id: name in logs and ledger.")
    ] = None,
    device: Annotated[str | None, typer.Option(help="producer.device for the hf engine.")] = None,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            help="producer.follow: after a run, serve the next consumer at the same address "
            "(a sweep's --external-producers).",
        ),
    ] = False,
    keys: KeysOpt = None,
    insecure: InsecureOpt = False,
    log_file: Annotated[Path | None, typer.Option(help="Also log to this file.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at DEBUG level.")] = False,
) -> None:
    """Run a producer: sample groups for the consumer's leases; reload its snapshots."""
    flags = {
        "net.connect": connect, "net.connect_file": connect_file, "producer.engine": engine,
        "producer.model": model,
        "producer.max_in_flight": max_in_flight, "producer.id": producer_id,
        "producer.device": device, "net.keys_dir": keys, "net.insecure": insecure or None,
        "producer.follow": follow or None,
    }  # fmt: skip
    cfg = load_config(config, set_, flags)
    if cfg.producer.model == "demo":  # the embedded demo model, built on this host
        cfg = C.override(cfg, {"producer.model": resolve_model("demo")})
    setup_logging(None, "producer", verbose)
    if log_file is not None:
        logging.getLogger().addHandler(logging.FileHandler(log_file))
    from producer.main import main as worker_main

    try:
        code = asyncio.run(worker_main(cfg))
    except ConfigError as exc:
        _fail(str(exc))
    raise typer.Exit(code)


@app.command(
    # The help text is given here rather than as a docstring: it is one line in the command list.
    help=(
        "Create CurveZMQ keys: the consumer's pair and one per producer host (run again to add "
        "hosts; existing keys are kept)."
    ),
    epilog=(
        "`asyncgrpo keys keys/ --producer gpu1 --producer gpu2`, then: the consumer takes "
        "`--keys keys/` (server/ and the allowlist clients/ stay on its host); copy "
        "keys/producers/gpu1/ to host gpu1 only and start it with `--keys DIR`. Delete "
        "keys/clients/gpu1.key to revoke gpu1."
    ),
)
def keys(
    directory: Annotated[Path, typer.Argument(help="Directory to create the keys in.")],
    producer_names: Annotated[
        list[str] | None,
        typer.Option("--producer", "-p", help="A producer host's name (repeatable)."),
    ] = None,
) -> None:
    from common.keys import create_keys

    try:
        homes = create_keys(directory, producer_names or ["producer"])
    except ConfigError as exc:
        _fail(str(exc))
    typer.echo(f"consumer host: --keys {directory}  (its secret: {directory}/server/; "
               f"allowlist: {directory}/clients/)")  # fmt: skip
    for home in homes:
        typer.echo(f"producer host {home.name}: copy {home}/ there, then --keys <that copy>")


DEMO_CONFIG = Path(__file__).parent / "configs" / "demo.toml"


@app.command()
def launch(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run_dir: Annotated[
        str | None, typer.Option("--run-dir", help="Run directory (default: runs/TIMESTAMP).")
    ] = None,
    steps: Annotated[int | None, typer.Option(help="run.steps: optimizer steps to take.")] = None,
    producers: Annotated[
        int | None,
        typer.Option(
            help="Producer processes to start (default: hf producers by the cores rule, "
            "printed at start; 2 for other engines).",
            min=1,
        ),
    ] = None,
    engine: Annotated[str | None, typer.Option(help="producer.engine: hf, vllm or fake.")] = None,
    max_staleness: Annotated[
        int | None, typer.Option(help="staleness.max_staleness (0 = synchronous).")
    ] = None,
    live: Annotated[
        bool | None,
        typer.Option(
            "--live/--no-live", help="Live dashboard (default: when stderr is a terminal)."
        ),
    ] = None,
    evaluate: Annotated[
        bool,
        typer.Option(
            "--eval/--no-eval", help="Evaluate the start and final models on the held-out split."
        ),
    ] = True,
    force: ForceOpt = False,
) -> None:
    """Run the whole pipeline here: one consumer and N producers, supervised.

    Without --config it trains the embedded demo (a tiny model this project builds itself) on the
    synthetic arithmetic task, shows live progress, evaluates the starting model and the final
    snapshot on the held-out split, and writes plots. Ctrl-C stops cleanly (final snapshot).
    """
    flags = {
        "run.dir": run_dir, "run.steps": steps, "producer.engine": engine,
        "staleness.max_staleness": max_staleness,
    }  # fmt: skip
    cfg = load_config(config or DEMO_CONFIG, set_, flags)
    out = make_run_dir(cfg, force)
    from launch import local

    cfg, producers = _split_cores(cfg, config, set_, producers)
    cfg = local.local_config(cfg, _given_keys(config, set_))

    model_dir = None
    if not cfg.train.simulate_step_s:
        typer.echo(
            f"model: {cfg.model.path} (building it the first time can take a minute)", err=True
        )
        model_dir = resolve_model(cfg.model.path)
    resolved: dict[str, object] = {"run.dir": out.resolve(), "net.control_port": 0}
    if model_dir is not None:
        resolved["model.path"] = model_dir
    cfg = C.override(cfg, resolved)
    C.write(cfg, out / "config.toml")
    typer.echo(f"run directory: {out}", err=True)
    show = sys.stderr.isatty() if live is None else live
    code = local.run(
        out / "config.toml", out, steps=cfg.run.steps, num_producers=producers, live=show
    )
    if evaluate and model_dir is not None and cfg.task.source == "synthetic":
        _evaluate_run(out, model_dir)
    from launch.report import report as write_report

    for path in write_report(out):
        typer.echo(f"wrote {path}", err=True)
    raise typer.Exit(code)


def _given_keys(config: Path | None, sets: list[str] | None) -> set[str]:
    """`section.key` names set by the user's config file (not the built-in demo's) or --set."""
    import tomllib

    data = tomllib.loads(config.read_text()) if config is not None else {}
    keys = {f"{sec}.{k}" for sec, table in data.items() if isinstance(table, dict) for k in table}
    return keys | {item.partition("=")[0].strip() for item in sets or []}


def _split_cores(
    cfg: C.Config, config: Path | None, sets: list[str] | None, producers: int | None
) -> tuple[C.Config, int]:
    """Producers and torch threads by the cores rule (launch/cores.py) for hf producers, the
    user's choices kept; prints the split. Other engines: 2 producers unless given."""
    if cfg.producer.engine != "hf":
        return cfg, producers or 2
    from launch import cores

    given = _given_keys(config, sets) & set(cores.KEYS)
    chosen = cores.plan(
        cores.usable_cores(),
        max_staleness=cfg.staleness.max_staleness,
        prompts_per_step=cfg.train.prompts_per_step,
        producers=producers,
    )
    values = {
        "model.torch_threads": chosen.learner_threads,
        "producer.torch_threads": chosen.producer_threads,
        "producer.max_in_flight": chosen.max_in_flight,
    }
    cfg = C.override(cfg, {k: v for k, v in values.items() if k not in given})
    shown = cores.CorePlan(
        chosen.cores, chosen.producers, cfg.model.torch_threads, cfg.producer.torch_threads,
        cfg.producer.max_in_flight,
    )  # fmt: skip
    typer.echo(
        cores.describe(shown, given=given | ({"producers"} if producers else set())), err=True
    )
    return cfg, chosen.producers


def _evaluate_run(run_dir: Path, model_dir: Path) -> None:
    from consumer.evaluate import evaluate_run

    r = evaluate_run(run_dir, model_dir)
    if r is None:
        typer.echo("no snapshot to evaluate", err=True)
        return
    start, final = r["initial_accuracy"], r["final_accuracy"]
    typer.secho(
        f"held-out greedy accuracy: start {start:.1%} → final (v{r['final_version']}) "
        f"{final:.1%} on {r['heldout_size']} problems",
        fg=typer.colors.GREEN if final > start else typer.colors.YELLOW,
        err=True,
    )


@app.command()
def report(run_dir: Annotated[Path, typer.Argument(help="A run directory.")]) -> None:
    """Write PNG plots (RUN_DIR/plots) and summary.md for a run, finished or not."""
    from launch.report import report as write_report

    if not run_dir.is_dir():
        _fail(f"{run_dir} is not a directory")
    for path in write_report(run_dir):
        typer.echo(f"wrote {path}")


@app.command()
def status(run_dir: Annotated[Path, typer.Argument(help="A run directory.")]) -> None:
    """Where a run stands (running or finished), from its files: the last step, the ledger,
    refused messages, each producer's weights, groups and reward failures."""
    from launch.dashboard import status as run_status

    if not (run_dir / "config.toml").exists():
        _fail(f"{run_dir} is not a run directory (no config.toml)")
    typer.echo(run_status(run_dir))


def _ints(text: str, name: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        _fail(f"{name} expects comma-separated integers, got {text!r}")
        raise AssertionError from None


@app.command(
    epilog=(
        "Examples. Transport and scheduling only (about 3 minutes):\n\n"
        "`asyncgrpo stress --out runs/sweep --max-staleness 0,1,2,4 --engine fake --steps 30`\n\n"
        "With learning (the demo model; about a minute per setting):\n\n"
        "`asyncgrpo stress --out runs/sweep-demo --engine demo --max-staleness 0,1,2,4 --steps 300`"
        "\n\nYour own model, task and rewards, three seeds, GPUs 1-3 for producers:\n\n"
        "`asyncgrpo stress --out runs/mine --config mine.toml --engine vllm --max-staleness 0,2,4 "
        "--seeds 0,1,2 --learner-gpus 0 --producer-gpus 1,2,3 --target-reward 0.6`\n\n"
        "Producers on other hosts (each started once: `asyncgrpo producer --follow --connect "
        "tcp://HOST:5555 --keys DIR`):\n\n"
        "`asyncgrpo stress --out runs/hosts --config mine.toml --engine vllm "
        "--external-producers 4 --bind 0.0.0.0:5555 --keys DIR`"
    )
)
def stress(
    out: Annotated[
        Path,
        typer.Option(help="Sweep directory: results.csv, summary.md, plots/, runs/SETTING/."),
    ],
    max_staleness: Annotated[
        str,
        typer.Option(help="Comma-separated max_staleness values; 0 is the synchronous baseline."),
    ] = "0,1,2,4",
    producers: Annotated[
        str,
        typer.Option(
            help="Comma-separated producer counts (default: 2 on a CPU, one per GPU the learner "
            "does not use)."
        ),
    ] = "",
    is_modes: Annotated[
        str,
        typer.Option(
            "--is",
            help="Comma-separated IS corrections: off, token-truncate, token-mask, "
            "sequence-truncate, sequence-mask (default: the config's loss.tis*).",
        ),
    ] = "",
    engine: Annotated[
        str,
        typer.Option(
            help="fake (scheduling only, no learning), hf or vllm (the config's model learns), "
            "demo (hf on the embedded demo config unless --config is given)."
        ),
    ] = "fake",
    steps: Annotated[int, typer.Option(help="Optimizer steps per setting.")] = 30,
    seeds: Annotated[
        str,
        typer.Option(
            help="Comma-separated seeds; every setting runs once per seed (prompt order, "
            "initialisation, each lease's sampling seed). A max_staleness = 0 setting repeats its "
            "tokens and rewards (weights to float rounding); in asynchronous ones which "
            "weights sample which group follows timing."
        ),
    ] = "0",
    target_reward: Annotated[
        float | None,
        typer.Option(help="Report the time and steps each setting takes to reach this reward."),
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="Finish an interrupted sweep: skip finished settings.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Start a new sweep in an --out that holds another one (deletes its sweep.json, "
            "runs/, results.csv, summary.md and plots/).",
        ),
    ] = False,
    external_producers: Annotated[
        int,
        typer.Option(
            help="Run no producers here: wait for this many `asyncgrpo producer --follow` "
            "started elsewhere before each setting starts."
        ),
    ] = 0,
    bind: Annotated[
        str, typer.Option(help="host:port every setting's consumer binds (--external-producers).")
    ] = "127.0.0.1:5555",
    learner_gpus: Annotated[
        str, typer.Option(help="The learner's GPU (default: the first no producer was given).")
    ] = "",
    producer_gpus: Annotated[
        str,
        typer.Option(
            help="One producer per listed GPU (list one twice for two); default: every GPU "
            "but the learner's, or beside the learner on a single GPU."
        ),
    ] = "",
    colocated_memory: Annotated[
        float, typer.Option(help="vLLM's share of a GPU it shares with the learner.")
    ] = 0.4,
    heldout: Annotated[
        bool,
        typer.Option(
            "--heldout/--no-heldout",
            help="Score each setting's snapshots on the held-out split (task.eval_path, or the "
            "synthetic task's) at equal steps and equal wall-clock.",
        ),
    ] = True,
    gen_s: Annotated[float, typer.Option(help="fake: seconds to generate one group.")] = 0.5,
    step_s: Annotated[float, typer.Option(help="fake: simulated learner step, seconds.")] = 0.5,
    slow: Annotated[
        float, typer.Option(help="Producer p1 generates this many times slower.")
    ] = 1.0,
    jitter: Annotated[
        float, typer.Option(help="fake: relative latency jitter (0.3 = ±30%).")
    ] = 0.0,
    long_tail: Annotated[
        float, typer.Option(help="fake: probability of a max-length completion.")
    ] = 0.0,
    stall_s: Annotated[
        float, typer.Option(help="Producer p2 stalls this long, 5 s after it starts.")
    ] = 0.0,
    publish_delay_s: Annotated[
        float, typer.Option(help="Delay every snapshot announcement by this long.")
    ] = 0.0,
    max_in_flight: Annotated[
        int, typer.Option(help="fake: leases each producer may hold (the bound caps them too).")
    ] = 8,
    config: ConfigOpt = None,
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
    """
    from launch import stress as S
    from launch.placement import placements

    modes = [m.strip() for m in is_modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in S.IS_MODES]
    if bad:
        _fail(f"--is: unknown {bad}; choose from {', '.join(S.IS_MODES)}")
    if engine not in ("fake", "demo", "hf", "vllm"):
        _fail("--engine must be fake, demo, hf or vllm")
    kind = "hf" if engine == "demo" else engine
    flags: dict[str, object] = {"net.keys_dir": keys, "net.insecure": insecure or None}
    base = load_config(config or (DEMO_CONFIG if kind != "fake" else None), set_, flags)
    if kind != "fake":
        base = C.override(base, {"model.path": resolve_model(base.model.path)})
    counts = _ints(producers, "--producers") or None
    try:
        where = {} if external_producers else placements(
            engine=kind, producer_counts=counts, colocated_memory=colocated_memory,
            learner_gpus=_ints(learner_gpus, "--learner-gpus") or None,
            producer_gpus=_ints(producer_gpus, "--producer-gpus") or None,
        )  # fmt: skip
        sweep = S.Sweep(
            engine=kind, steps=steps, target_reward=target_reward, external=external_producers,
            bind=bind if external_producers else "", placements=where, heldout=heldout,
            given=frozenset(_given_keys(config, set_)),
            scenario=S.Scenario(
                gen_s=gen_s, step_s=step_s, slow_factor=slow, jitter=jitter, long_tail=long_tail,
                stall_s=stall_s, publish_delay_s=publish_delay_s, max_in_flight=max_in_flight,
            ),
        )  # fmt: skip
        todo = S.settings(
            _ints(max_staleness, "--max-staleness"), [external_producers] if external_producers
            else list(where), modes or [S.is_label(base)], _ints(seeds, "--seeds"),
        )  # fmt: skip
        S.check_settings(base, sweep, todo)
    except ConfigError as exc:
        _fail(str(exc))
    if external_producers:
        typer.echo(
            f"each setting waits for {external_producers} producers: start them (once) with "
            f"`asyncgrpo producer --follow --connect tcp://{bind}`"
            + (f" --keys {keys}" if keys else ""),
            err=True,
        )
    try:
        rows, interrupted = S.run_sweep(base, out, todo, sweep, resume=resume, force=force)
    except ConfigError as exc:  # a directory holding another sweep
        _fail(str(exc))
    for r in rows:
        typer.echo(S.row_line(r))
    typer.echo(f"wrote {out / 'results.csv'}, {out / 'summary.md'} and {out / 'plots'}")
    if interrupted:
        typer.echo("interrupted: run the same command with --resume to finish", err=True)
        raise typer.Exit(130)
    raise typer.Exit(1 if any(r["status"] != "ok" for r in rows) else 0)


@app.command("make-model")
def make_model(
    out: Annotated[
        Path | None, typer.Argument(help="Directory to write (default: the cache).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the build (the default model uses 0).")] = 0,
) -> None:
    """Build the embedded demo model (own tokenizer, small Llama, short supervised warm-up)."""
    from launch.demo_model import build_demo_model, ensure_demo_model

    path = build_demo_model(out, seed=seed) if out is not None else ensure_demo_model()
    typer.echo(str(path))


@app.command("eval")
def eval_(
    model: Annotated[Path, typer.Argument(help="Model directory or snapshot directory.")],
    snapshot: Annotated[
        Path | None, typer.Option(help="A model.safetensors to load over MODEL's weights.")
    ] = None,
    n: Annotated[int | None, typer.Option(help="Held-out problems to use (default: all).")] = None,
) -> None:
    """Greedy accuracy of a model (or snapshot) on the synthetic task's held-out split."""
    from consumer.evaluate import greedy_accuracy

    result = greedy_accuracy(model, snapshot=snapshot, n=n)
    typer.echo(f"accuracy {result.accuracy:.4f} ({result.correct}/{result.total})")


@config_app.command("show")
def config_show(config: ConfigOpt = None, set_: SetOpt = None) -> None:
    """Print the resolved configuration as TOML, each key with its help as a comment."""
    cfg = load_config(config, set_, {})
    helps = {key: text for key, _, _, text in C.field_help()}
    section = ""
    for line in C.to_toml(cfg).splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif "=" in line and section:
            key = f"{section}.{line.split('=')[0].strip()}"
            if key in helps:
                typer.echo(f"# {helps[key]}")
        typer.echo(line)


@config_app.command("docs")
def config_docs() -> None:
    """Print the Markdown table of every config key (the README's reference)."""
    typer.echo("| key | type | default | meaning |\n|---|---|---|---|")
    for key, tname, default, text in C.field_help():
        shown = _shown(default)
        typer.echo(f"| `{key}` | {tname} | `{shown}` | {text} |")


def main() -> None:
    # transformers' per-file progress bars ("Loading weights", "Writing model shards") would
    # interleave with our own progress display; children inherit the setting.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    app()


if __name__ == "__main__":
    main()

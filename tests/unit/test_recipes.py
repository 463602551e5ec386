"""The multi-machine recipes (launch/recipes/) with --dry-run: the commands they would run are
printed, and each one is checked: every asyncgrpo command parses with the real CLI, the keys go
where common/net/keys.py says (the learner never receives a producer's secret, each producer host
only its own), producers connect to the learner."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import typer.main

from launch.cli import app

RECIPES = Path(__file__).parents[2] / "launch" / "recipes"


def _dry_run(script: str, *args: str, env: dict[str, str]) -> list[list[str]]:
    out = subprocess.run(
        ["bash", str(RECIPES / script), "--dry-run", *args],
        env={**os.environ, **env}, capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    return [shlex.split(line) for line in out.stdout.splitlines() if line.strip()]


def _asyncgrpo(argv: list[str]) -> list[str]:
    """The asyncgrpo command inside `argv` (srun prefix, or an ssh remote string), parsed by the
    real CLI (an unknown option or a missing value fails here)."""
    if argv[0] == "ssh":
        argv = shlex.split(argv[2])
    start = argv.index("asyncgrpo")
    end = argv.index(">") if ">" in argv else len(argv)
    words = argv[start + 1 : end]
    group = typer.main.get_command(app)
    command = group.get_command(group.make_context("asyncgrpo", [words[0], "--help"]), words[0])
    assert command is not None, words
    command.make_context(words[0], words[1:])  # parses and validates, runs nothing
    return words


def _option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_the_ssh_recipe_sends_each_host_only_its_keys():
    env = {"LEARNER": "10.0.0.1", "PRODUCERS": "gpu1 gpu2", "MODEL": "/m", "RUN": "runs/r"}
    cmds = _dry_run("ssh.sh", env=env)
    assert cmds[0] == ["asyncgrpo", "keys", "keys", "--producer", "gpu1", "--producer", "gpu2"]
    copies = {c[-1].split(":")[0]: c[3:-1] for c in cmds if c[0] == "scp"}
    assert copies == {
        "10.0.0.1": ["keys/server", "keys/clients"],
        "gpu1": ["keys/producers/gpu1"],
        "gpu2": ["keys/producers/gpu2"],
    }
    started = {c[1]: _asyncgrpo(c) for c in cmds if c[0] == "ssh" and "asyncgrpo" in c[2]}
    assert started["10.0.0.1"][0] == "consumer"
    assert _option(started["10.0.0.1"], "--keys") == "runs/r/keys"
    for host in ("gpu1", "gpu2"):
        words = started[host]
        assert words[0] == "producer"
        assert _option(words, "--connect") == "tcp://10.0.0.1:5555"
        assert _option(words, "--id") == host
        # the directory its own keys were copied to
        assert f"{host}:{_option(words, '--keys')}" in [c[-1] for c in cmds if c[0] == "scp"]


def test_the_slurm_recipe_starts_one_consumer_and_a_keyed_producer_per_gpu():
    env = {"NODES": "n0 n1 n2", "SLURM_JOB_ID": "7", "SLURM_GPUS_PER_NODE": "2"}
    cmds = _dry_run("slurm.sbatch", "/models/q", "data/train.jsonl", env=env)
    names = [f"n{n}-gpu{g}" for n in (1, 2) for g in (0, 1)]
    keys_cmd = next(c for c in cmds if c[:2] == ["asyncgrpo", "keys"])
    assert keys_cmd[4::2] == names
    learner = [c for c in cmds if c[0] == "srun" and "launch.cli consumer" in " ".join(c)]
    assert len(learner) == 1
    assert "--keys runs/slurm-7/keys --model /models/q" in learner[0][-1]
    started = [_asyncgrpo(c) for c in cmds if c[0] == "srun" and "asyncgrpo" in c]
    producers = {_option(w, "--id"): w for w in started if w[0] == "producer"}
    assert sorted(producers) == names
    for name, words in producers.items():
        assert _option(words, "--keys") == f"runs/slurm-7/keys/producers/{name}"
        assert _option(words, "--connect") == "tcp://n0:5555"
    gpus = [c for c in cmds if c[0] == "srun" and "producer" in c]
    assert [c[4] for c in gpus] == [f"--export=ALL,CUDA_VISIBLE_DEVICES={g}" for g in (0, 1) * 2]

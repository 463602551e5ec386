"""The real model's run (docs/real_model.md) through `asyncgrpo launch` against TRL's GRPOTrainer
on the same settings: s/step, time to a held-out score, CPU use per process, peak memory, disk.

    PYTHONPATH=. python bench/real_model_vs_trl.py --model models/smollm2-135m-instruct \\
        --seeds 0,1,2 --steps 10 --json out.json [--keep DIR] [--no-trl] [--threshold 0.4]
        [--tree DIR] [--no-score]
    PYTHONPATH=. python bench/real_model_vs_trl.py --model models/smollm2-135m-instruct \\
        --keep DIR --score-only [--first-hit] --json out.json   # score kept runs, summarise
                                    # (runs a previous --score-only scored are kept as scored)

`--tree DIR` runs another checkout's `launch` (e.g. the code before a change) with this bench.
Scoring is not timed: `--no-score` with `--keep` leaves it for a later `--score-only`.

For each seed, one after another, each started as its own command (the clock starts when it is
started: imports, model loading and start-up count):
- ours: `asyncgrpo launch --config docs/real_model/smollm2.toml --steps N --no-eval` (its
  reward module through PYTHONPATH), the cores rule and the core board as a user gets them;
- trl: bench/trl_grpo.py with the same config: the same model directory, prompts in the same
  order, G, temperature, max_new_tokens, lr, betas, clipping, float32, torch's default threads.
While a run goes, a sampler (every 0.5 s) reads every process of the command's tree from /proc
(psutil): CPU seconds, and at the end each one's peak resident set (VmHWM); for ours it
hard-links each published snapshot into a side directory as it appears, so that the run prunes
as it always does (its disk is measured as a user has it) and every version can be scored
afterwards; TRL's runner saves each step's weights (`--save-weights`), and the seconds that
takes are taken out of its clock. After the runs every version of every run is scored by
`consumer.evaluation.score_model` (the documented held-out split, greedy, the task's reward): one
evaluator for both.

Figures per run (seconds unless said):
- s_per_step: (end of step N - end of step 1) / (N - 1);
- t_threshold_s: command start -> end of the first step whose version scores >= --threshold
  on the held-out split (null if none did);
- cpu_cores: CPU-seconds of every process of the command / wall seconds, over steps 3..N
  (`cpu_by_process`: the same per process kind: learner, producer, launcher, other);
- peak_rss_mb by process kind; for ours `learner_rss_over_state`: the learner's peak over
  weights + grads + AdamW moments + one host snapshot buffer (4 x float32 parameters + the
  snapshot's bytes);
- disk_mb (ours): the run directory when the command ends; `disk_over_kept`: over the
  snapshots `snapshot.keep_last` keeps plus one optimizer state (2 x float32 parameters);
- heldout: the score of every version (v0 = the start), final_heldout the last;
- cpu_timeline: per sample, the cores each process kind used since the previous one (when the
  learner and the producer are busy, together or in turn).

JSON keys (stable): for R in ours, trl: R_s_per_step, R_t_threshold_s, R_cpu_cores,
R_peak_rss_mb (the learner's / TRL's process), R_final_heldout (medians over seeds; a threshold
some seed never reached counts as infinite, an infinite median is null); ours_disk_mb,
ours_disk_over_kept, ours_learner_rss_over_state, ours_producer_rss_mb; ratios
ours_over_trl_step, ours_over_trl_threshold; seeds, steps, threshold, cpus, trl_version,
load_avg_1min_start, load_avg_1min_end, and runs: every run's figures (also written to
`--keep`'s runs.json as each run ends, before the scoring).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "docs" / "real_model" / "smollm2.toml"
KINDS = ("ours", "trl")
MB = 1 << 20


def kind_of(cmdline: list[str]) -> str:
    """learner, producer, launcher, trl or other, from a process's command line."""
    text = " ".join(cmdline)
    for word, kind in (
        ("trl_grpo.py", "trl"),
        (" consumer ", "learner"),
        (" producer ", "producer"),
        (" launch ", "launcher"),
    ):
        if word in f" {text} ":
            return kind
    return "other"


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


class Sampler:
    """CPU seconds of every process of a command's tree over time, each one's peak RSS, and
    (ours) every published snapshot hard-linked into `keep` as it appears."""

    def __init__(self, root: int, *, snapshots: Path | None, keep: Path, period_s: float = 0.5):
        self.root, self.snapshots, self.keep, self.period_s = root, snapshots, keep, period_s
        self.samples: list[tuple[float, dict[int, float]]] = []
        self.kinds: dict[int, str] = {}
        self.peaks: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            time.sleep(self.period_s)

    def _sample(self) -> None:
        try:
            procs = [psutil.Process(self.root)]
            procs += procs[0].children(recursive=True)
        except psutil.Error:
            return
        cpu: dict[int, float] = {}
        for p in procs:
            try:
                t = p.cpu_times()
                cpu[p.pid] = t.user + t.system
                if p.pid not in self.kinds:
                    self.kinds[p.pid] = kind_of(p.cmdline())
            except psutil.Error:
                continue
            peak = peak_rss_mb(p.pid)
            if peak is not None:
                self.peaks[p.pid] = max(self.peaks.get(p.pid, 0.0), peak)
        self.samples.append((time.time(), cpu))
        if self.snapshots is not None and self.snapshots.is_dir():
            for d in self.snapshots.glob("v[0-9]*"):
                src, dst = d / "model.safetensors", self.keep / f"{d.name}.safetensors"
                if src.exists() and not dst.exists() and (d / "manifest.json").exists():
                    with contextlib.suppress(OSError):  # pruned meanwhile
                        os.link(src, dst)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def timeline(self, t0: float) -> list[list[Any]]:
        """[seconds since t0, {kind: cores used since the previous sample}] per sample."""
        out: list[list[Any]] = []
        for (ta, a), (tb, b) in zip(self.samples, self.samples[1:], strict=False):
            used: dict[str, float] = {}
            for pid, cpu in b.items():
                kind = self.kinds.get(pid, "other")
                used[kind] = used.get(kind, 0.0) + (cpu - a.get(pid, cpu)) / (tb - ta)
            out.append([round(tb - t0, 2), {k: round(v, 2) for k, v in used.items()}])
        return out

    def cpu_between(self, t0: float, t1: float) -> dict[str, float]:
        """CPU-seconds per process kind between the samples nearest t0 and t1."""

        def at(t: float) -> dict[int, float]:
            return min(self.samples, key=lambda s: abs(s[0] - t))[1]

        a, b = at(t0), at(t1)
        out: dict[str, float] = {}
        for pid, cpu in b.items():
            kind = self.kinds.get(pid, "other")
            out[kind] = out.get(kind, 0.0) + cpu - a.get(pid, 0.0)
        return out


def command(kind: str, seed: int, a: argparse.Namespace, work: Path) -> list[str]:
    sets = [f"model.path={a.model.resolve()}", f"run.seed={seed}"]
    if kind == "trl":
        args = [sys.executable, str(ROOT / "bench" / "trl_grpo.py"), "--config", str(a.config)]
        args += ["--seed", str(seed), "--steps", str(a.steps), "--out", str(work / "steps.jsonl")]
        args += ["--save-weights", str(work / "weights")]
        return args + [x for s in sets for x in ("--set", s)]
    args = [sys.executable, "-m", "launch.cli", "launch", "--config", str(a.config)]
    args += ["--run-dir", str(work / "run"), "--steps", str(a.steps), "--no-live", "--no-eval"]
    return args + [x for s in sets for x in ("--set", s)]


def step_times(kind: str, work: Path) -> list[float]:
    """Each step's end (unix time, TRL's without the time spent saving its weights)."""
    if kind == "ours":
        lines = (work / "run" / "metrics.jsonl").read_text().splitlines()
        return [json.loads(x)["unix_time"] for x in lines if x.strip()]
    out, saved = [], 0.0
    for x in (work / "steps.jsonl").read_text().splitlines():
        r = json.loads(x)
        out.append(r["unix_time"] - saved)
        saved += r.get("save_s", 0.0)
    return out


def run_one(kind: str, seed: int, a: argparse.Namespace, root: Path) -> dict[str, Any]:
    work = root / f"{kind}-seed{seed}"
    (work / "weights").mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(a.tree), str(a.config.parent)])}
    load = os.getloadavg()[0]
    t0 = time.time()
    with (root / f"{kind}-seed{seed}.log").open("w") as log:
        proc = subprocess.Popen(
            command(kind, seed, a, work), cwd=a.tree, env=env, stdout=log, stderr=subprocess.STDOUT
        )
        snaps = work / "run" / "snapshots" if kind == "ours" else None
        sampler = Sampler(proc.pid, snapshots=snaps, keep=work / "weights")
        code = proc.wait()
        sampler.stop()
    t_end = time.time()
    if code != 0:
        tail = (root / f"{kind}-seed{seed}.log").read_text()[-2000:]
        raise RuntimeError(f"{kind} (seed {seed}) exited {code}\n{tail}")
    times = step_times(kind, work)
    steady = times[2] if len(times) > 3 else times[0]  # from the end of step 3 (kept by...)
    by_kind = sampler.cpu_between(steady, times[-1])
    span = times[-1] - steady
    peaks: dict[str, float] = {}
    for pid, mb in sampler.peaks.items():
        k = sampler.kinds.get(pid, "other")
        peaks[k] = max(peaks.get(k, 0.0), mb)
    out: dict[str, Any] = {
        "kind": kind,
        "seed": seed,
        "load_avg_1min": load,
        "command_s": t_end - t0,
        "steps": len(times),
        "s_per_step": (times[-1] - times[0]) / max(len(times) - 1, 1),
        "step_ends_s": [t - t0 for t in times],
        "cpu_cores": sum(by_kind.values()) / span if span > 0 else None,
        "cpu_by_process": {k: v / span for k, v in by_kind.items()} if span > 0 else {},
        "peak_rss_mb": peaks,
        "work": str(work),
        "cpu_timeline": sampler.timeline(t0),
    }
    if kind == "ours":
        out["disk_mb"] = du_mb(work / "run")
    return out


def du_mb(path: Path) -> float:
    """Bytes on disk under `path` (each hard-linked file once), in MB."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for p in path.rglob("*"):
        try:
            st = p.lstat()
        except OSError:
            continue
        if p.is_file() and (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total / MB


def score_versions(run: dict[str, Any], a: argparse.Namespace) -> None:
    """Every kept version's held-out score (the documented evaluator, one for both)."""
    from common import config as C
    from consumer.evaluation import score_model
    from producer.rewards.judge import HeldOutJudge

    cfg = C.load(a.config, [f"model.path={a.model.resolve()}", f"run.seed={run['seed']}"])

    def score(version: int) -> float:
        return score_model(cfg, a.model.resolve(), paths[version], judge=HeldOutJudge).score

    scores: dict[int, float] = {}
    paths = {int(p.stem[1:]): p for p in (Path(run["work"]) / "weights").glob("v*.safetensors")}
    versions = sorted(v for v in paths if v <= run["steps"])
    for version in versions:
        if a.first_hit and any(x >= a.threshold for x in scores.values()):
            break  # then only the last version (final_heldout)
        scores[version] = score(version)
        print(f"  {run['kind']} seed {run['seed']} v{version}: {scores[version]:.3f}", flush=True)
    if versions and versions[-1] not in scores:
        scores[versions[-1]] = score(versions[-1])
    run["heldout"] = scores
    run["final_heldout"] = scores.get(max(scores)) if scores else None
    hit = next((v for v in sorted(scores) if scores[v] >= a.threshold), None)
    ends = run["step_ends_s"]
    run["t_threshold_s"] = None if hit is None else (0.0 if hit == 0 else ends[hit - 1])


def median(values: list[float | None]) -> float | None:
    m = statistics.median([math.inf if v is None else v for v in values])
    return None if math.isinf(m) else m


def state_mb(model: Path, keep_last: int) -> tuple[float, float]:
    """(weights + grads + AdamW moments + one float32 snapshot buffer, the snapshots kept plus
    one optimizer state) in MB, from the model's parameter count."""
    from safetensors import safe_open

    with safe_open(str(model / "model.safetensors"), framework="pt") as f:
        n = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())  # noqa: SIM118
    weights = 4 * n / MB
    return 5 * weights, (keep_last + 2) * weights


def summarise(runs: list[dict[str, Any]], a: argparse.Namespace) -> dict[str, Any]:
    from common import config as C

    keep_last = C.load(a.config).snapshot.keep_last
    rss_state, disk_kept = state_mb(a.model, keep_last)
    res: dict[str, Any] = {}
    for kind in KINDS:
        mine = [r for r in runs if r["kind"] == kind]
        proc = "learner" if kind == "ours" else "trl"
        res[f"{kind}_s_per_step"] = median([r["s_per_step"] for r in mine]) if mine else None
        res[f"{kind}_t_threshold_s"] = median([r["t_threshold_s"] for r in mine]) if mine else None
        res[f"{kind}_cpu_cores"] = median([r["cpu_cores"] for r in mine]) if mine else None
        res[f"{kind}_peak_rss_mb"] = (
            median([r["peak_rss_mb"].get(proc) for r in mine]) if mine else None
        )
        res[f"{kind}_final_heldout"] = median([r["final_heldout"] for r in mine]) if mine else None
    ours = [r for r in runs if r["kind"] == "ours"]
    res["ours_disk_mb"] = median([r["disk_mb"] for r in ours]) if ours else None
    res["ours_disk_over_kept"] = res["ours_disk_mb"] / disk_kept if ours else None
    peak = res["ours_peak_rss_mb"]
    res["ours_learner_rss_over_state"] = peak / rss_state if peak else None
    res["ours_producer_rss_mb"] = (
        median([r["peak_rss_mb"].get("producer") for r in ours]) if ours else None
    )
    for fig, key in (("s_per_step", "step"), ("t_threshold_s", "threshold")):
        o, t = res[f"ours_{fig}"], res[f"trl_{fig}"]
        res[f"ours_over_trl_{key}"] = o / t if o and t else None
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True, help="the converted model directory")
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--seeds", default="0", help="comma-separated run seeds")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threshold", type=float, default=0.4, help="held-out score to reach")
    ap.add_argument("--no-trl", action="store_true", help="skip TRL even if it is installed")
    ap.add_argument("--keep", type=Path, help="keep run directories and logs here")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument(
        "--tree", type=Path, default=ROOT, help="the checkout whose `launch` runs (ours), e.g. main"
    )
    ap.add_argument("--no-score", action="store_true", help="leave the held-out scoring out")
    ap.add_argument(
        "--first-hit",
        action="store_true",
        help="score versions in order only up to the first that reaches --threshold, then the "
        "last (enough for the time to the threshold and the final score)",
    )
    ap.add_argument(
        "--score-threads",
        type=int,
        default=0,
        help="torch threads of the scoring (0: torch's default; 1 on a machine other work shares: "
        "two threads spin against each other there)",
    )
    ap.add_argument(
        "--score-only",
        action="store_true",
        help="run nothing: score the runs kept in --keep (its runs.json) and summarise them",
    )
    a = ap.parse_args()
    a.tree = a.tree.resolve()
    a.config = a.config.resolve()
    seeds = [int(s) for s in a.seeds.split(",")]
    has_trl = importlib.util.find_spec("trl") is not None and not a.no_trl
    kinds = [k for k in KINDS if k != "trl" or has_trl]
    load_start = os.getloadavg()[0]
    sys.path.insert(0, str(a.config.parent))  # the task's reward module, for the evaluator
    if a.score_threads:
        import torch

        torch.set_num_threads(a.score_threads)
    if a.score_only and a.keep is None:
        ap.error("--score-only needs --keep DIR (where the runs and their runs.json are)")
    with tempfile.TemporaryDirectory() as tmp:
        root = a.keep or Path(tmp)
        runs = json.loads((root / "runs.json").read_text()) if a.score_only else []
        if a.score_only:
            seeds = sorted({r["seed"] for r in runs})
            load_start = min((r["load_avg_1min"] for r in runs), default=load_start)
        for seed in [] if a.score_only else seeds:
            for kind in kinds:
                runs.append(run_one(kind, seed, a, root))
                shown = {
                    k: v for k, v in runs[-1].items() if k not in ("step_ends_s", "cpu_timeline")
                }
                print(f"{kind} seed {seed}: {json.dumps(shown)}", flush=True)
                (root / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")
        load_end = os.getloadavg()[0]
        for run in runs:
            if a.score_only and run.get("heldout"):  # scored by an earlier --score-only
                run["heldout"] = {int(v): x for v, x in run["heldout"].items()}
                continue
            if a.no_score:
                run.update(heldout={}, final_heldout=None, t_threshold_s=None)
                continue
            score_versions(run, a)
            print(f"{run['kind']} seed {run['seed']}: held-out {run['heldout']}", flush=True)
            (root / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")
    res = summarise(runs, a) | {
        "seeds": seeds,
        "steps": a.steps,
        "threshold": a.threshold,
        "cpus": len(os.sched_getaffinity(0)),
        "trl_version": importlib.metadata.version("trl") if has_trl else None,
        "load_avg_1min_start": load_start,
        "load_avg_1min_end": load_end,
        "runs": runs,
    }
    print(json.dumps({k: v for k, v in res.items() if k != "runs"}, indent=1))
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The vLLM producer on a real GPU, in one call: log-prob agreement, throughput, reload latency.

Runs on one CUDA GPU (Hopper; tried with vLLM 0.24.0, FLASH_ATTN) with the project and vLLM
importable (`pip install -e '.[vllm]'`, or vLLM unpacked elsewhere and put on PYTHONPATH), no
network needed (every model is built here); about 9 minutes for all phases on an H100:

    export PYTHONPATH=.:$PYTHONPATH VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1
    PYTHONUNBUFFERED=1 python3 bench/device_vllm.py all --phases build,qwen05,demo --out OUT
    PYTHONUNBUFFERED=1 python3 bench/device_vllm.py all --phases pipeline --out OUT
    PYTHONUNBUFFERED=1 python3 bench/device_vllm.py all --phases build,sweep --out OUT  # ~7 min

It prints a table and writes OUT/device_vllm.json with every number, one log per phase.

Phases (each in its own process, so GPU memory is returned and vLLM can fork its engine before
CUDA is initialised in that process; results in $OUT/<phase>.json, logs in $OUT/<phase>.log):
- `build`: a random-initialised model of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 heads,
  2 KV heads, intermediate 4864, vocab 151936, tied embeddings; bf16), model A and a perturbed
  copy B, with a byte-level BPE tokenizer trained here (4096 tokens; the model's vocabulary is
  padded up to Qwen's size). Also checks which of the project's imports the image lacks.
- `qwen05`: `VLLMEngine` on A.
  a) behaviour log-probs vs a learner-style transformers forward (float32 and bf16) of the same
     weights, `common.sampling.logprobs.sampled_logprobs` at the sampling temperature, before and
     after an idle reload to B, at each temperature; and three in-flight reloads during which tokens
     sampled before the switch are compared with the old weights, after it with the new ones (by the
     per-token versions the engine recorded). The `bf16 floor` row compares the float32 and bf16
     learners with each other on the same sampled tokens: what bf16 weights alone change in this
     model's log-probs, the floor under any vLLM (bf16) vs learner gap.
  b) tokens/s through `VLLMEngine.generate` (many concurrent groups, streamed deltas) vs the
     same AsyncLLM driven directly with FINAL_ONLY outputs, same settings and prompts.
  c) publish + reload: `consumer.snapshots.publisher.Publisher` on the learner's CUDA weights (the
     training thread's submit, the copy into pinned memory, the writer), then `load_weights`
     with requests in flight.
- `demo`: a) on the embedded demo model (launch/demo_model.py), built (with its perturbed copy)
  in a child process (`demo_build`), so that this one starts vLLM before anything touches CUDA.
- `pipeline`: one GPU, two processes: the consumer (learner) and a vLLM producer through the CLI
  (bench/gpu_pipeline.py), on the demo model and on the 0.5B shape; idle fraction, tokens/s,
  publication (`publish_submit_s`: the training thread's block per publish; `snapshot_write_s`:
  the writer; versions superseded), wall per step over the learner's step, and step-to-reload
  latency; `q05_targets` sets them beside the publication targets.
- `sweep`: `asyncgrpo stress --engine vllm --max-staleness 0,2` on one GPU (bench/gpu_sweep.py):
  the learner and one colocated vLLM producer on the 0.5B shape, 20 steps per setting; steps/hour,
  speedup over synchronous and reward at the synchronous setting's wall-clock per setting.

Definitions: for a sampled token, d = logp_learner - logp_vllm; TIS weight w = min(exp(d), 2);
"truncated" = exp(d) > 2. Pause = seconds in which the engine generated nothing for the switch.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
for _k, _v in {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",  # no flashinfer in the device bundle
    "PYTORCH_NVML_BASED_CUDA_CHECK": "1",  # is_available() must not initialise CUDA before fork
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_k, _v)
from shapes import QWEN05_SHAPE  # noqa: E402

EMB_SCALE = 5.0  # embedding std 0.1: logits std ~3, next-token entropy well below log(vocab)
NOISE_REL = 0.3  # snapshot B = A + noise of this size relative to each tensor's std
TEMPERATURES = (1.0, 0.7)
G = 8
PROMPTS = [
    'def parse_header(line):\n    """Split a \'Key: value\' line into a pair."""\n',
    "import json\nimport os\n\n\ndef load_settings(path):\n",
    "# Count how often each word occurs in a file and print the ten most common.\n",
    "class Queue:\n    def __init__(self, capacity):\n        self.items = []\n",
    "    for index, value in enumerate(values):\n        if value < 0:\n",
    "def merge_sorted(a, b):\n    result = []\n    i = j = 0\n",
    "try:\n    import numpy as np\nexcept ImportError:\n    np = None\n\n",
    "    return {key: value for key, value in pairs if key not in skip}\n\n\n",
]
PROJECT_IMPORTS = [
    "msgpack",
    "zmq",
    "blake3",
    "tomli_w",
    "typer",
    "rich",
    "psutil",
    "matplotlib",
    "math_verify",
    "pytest",
    "pytest_asyncio",
    "pytest_timeout",
    "safetensors",
    "numpy",
    "common.config",
    "common.wire",
    "common.weights.snapshot",
    "producer.main",
    "consumer.learner",
    "launch.cli",
]


# ------------------------------------------------------------------------------ helpers
def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def delta_stats(d: Any, cap: float = 2.0) -> dict[str, float]:
    """Summary of d = learner - behaviour log-probs (numpy array)."""
    import numpy as np

    d = np.asarray(d, np.float64)
    if d.size == 0:
        return {"tokens": 0}
    w = np.exp(d)
    return {
        "tokens": int(d.size),
        "mean_abs": float(np.abs(d).mean()),
        "max_abs": float(np.abs(d).max()),
        "tis_mean": float(np.minimum(w, cap).mean()),
        "frac_truncated": float((w > cap).mean()),
    }


def build_tokenizer(out: Path) -> Any:
    """Byte-level BPE (4096 tokens) trained on the standard library's sources."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=4096,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(sorted(str(p) for p in Path(os.__file__).parent.glob("*.py"))[:120], trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    fast.save_pretrained(out)
    return fast


def perturb_(model: Any, rel: float, seed: int) -> None:
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=gen).to(p.device)
            p.copy_((p.float() + noise * (rel * float(p.float().std()) + 1e-3)).to(p.dtype))


class Learner:
    """A transformers model on the GPU computing log-probs the way the learner does."""

    def __init__(self, path: Path, dtype: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
        self.model = self.model.cuda().eval()  # type: ignore[call-arg]

    def logprobs(self, prompt: list[int], completions: list[Any], temperature: float) -> list[Any]:
        """Per completion, float64 log-probs of its tokens (right-padded batch, causal)."""
        import torch

        from common.sampling.logprobs import sampled_logprobs

        n_p, width = len(prompt), max(len(c.token_ids) for c in completions)
        ids = torch.zeros((len(completions), n_p + width), dtype=torch.long)
        ids[:, :n_p] = torch.tensor(prompt)
        for i, c in enumerate(completions):
            ids[i, n_p : n_p + len(c.token_ids)] = torch.from_numpy(c.token_ids.astype("int64"))
        ids = ids.cuda()
        with torch.no_grad():
            logits = self.model(ids).logits[:, n_p - 1 : -1]
            lp = sampled_logprobs(logits, ids[:, n_p:], temperature=temperature)
        out = lp.double().cpu().numpy()
        return [out[i, : len(c.token_ids)] for i, c in enumerate(completions)]


def compare(groups: list[Any], learner: Learner, temperature: float) -> dict[str, float]:
    """delta_stats over every token of [(prompt, completions)]."""
    import numpy as np

    d = []
    for prompt, comps in groups:
        for lp, c in zip(learner.logprobs(prompt, comps, temperature), comps, strict=True):
            d.append(lp - c.logprobs.astype(np.float64))
    return delta_stats(np.concatenate(d))


def compare_learners(
    groups: list[Any], a: Learner, b: Learner, temperature: float
) -> dict[str, Any]:
    """delta_stats of a - b (two learners' log-probs) on the same sampled tokens."""
    import numpy as np

    d: list[Any] = []
    for prompt, comps in groups:
        lp_a, lp_b = a.logprobs(prompt, comps, temperature), b.logprobs(prompt, comps, temperature)
        d.extend(x - y for x, y in zip(lp_a, lp_b, strict=True))
    return delta_stats(np.concatenate(d))


def compare_split(
    groups: list[Any], old: Learner, new: Learner, new_version: int
) -> dict[str, Any]:
    """Tokens with version < new_version against `old`, the others against `new` (T = 1)."""
    import numpy as np

    pre, post = [], []
    for prompt, comps in groups:
        lp_old, lp_new = old.logprobs(prompt, comps, 1.0), new.logprobs(prompt, comps, 1.0)
        for a, b, c in zip(lp_old, lp_new, comps, strict=True):
            after = c.versions >= new_version
            pre.append((a - c.logprobs)[~after])
            post.append((b - c.logprobs)[after])
    return {
        "pre_vs_old": delta_stats(np.concatenate(pre)),
        "post_vs_new": delta_stats(np.concatenate(post)),
    }


async def sample(engine: Any, prompts: list[Any], temperature: float, max_new: int) -> list[Any]:
    from producer.engines.base import SamplingParams

    params = SamplingParams(n=G, temperature=temperature, max_new_tokens=max_new)
    outs = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    return list(zip(prompts, outs, strict=True))


def switch_metrics(engine: Any) -> dict[str, Any]:
    return {
        "mode": engine.last_mode,
        "pause_s": engine.last_pause_s,
        "reload_s": engine.last_reload_s,
        "wait_s": engine.last_wait_s,
    }


# ------------------------------------------------------------------------------ build
def phase_build(work: Path) -> dict[str, Any]:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    res: dict[str, Any] = {"imports": check_imports()}
    t0 = time.perf_counter()
    a_dir, b_dir = work / "q05_a", work / "q05_b"
    tok = build_tokenizer(a_dir)
    tok.save_pretrained(b_dir)
    eos = tok.eos_token_id
    cfg = Qwen2Config(**QWEN05_SHAPE, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16).eval()  # type: ignore[arg-type]
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(EMB_SCALE)
    model.save_pretrained(a_dir)
    perturb_(model, NOISE_REL, seed=1)
    model.save_pretrained(b_dir)
    res.update(
        params=sum(p.numel() for p in model.parameters()),
        tokenizer_vocab=len(tok),
        build_s=time.perf_counter() - t0,
        a_bytes=(a_dir / "model.safetensors").stat().st_size,
    )
    return res


def check_imports() -> dict[str, str]:
    out = {}
    for name in PROJECT_IMPORTS:
        try:
            mod = importlib.import_module(name)
            out[name] = str(getattr(mod, "__version__", "ok"))
        except Exception as exc:  # report every missing piece, not just the first
            out[name] = f"MISSING: {type(exc).__name__}: {exc}"[:160]
    return out


# ------------------------------------------------------------------------------ qwen05
def phase_qwen05(work: Path) -> dict[str, Any]:
    return asyncio.run(_qwen05(work))


async def _qwen05(work: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from common.config import VllmConfig
    from producer.engines.vllm import VLLMEngine

    a_dir, b_dir = work / "q05_a", work / "q05_b"
    vcfg = VllmConfig(
        gpu_memory_utilization=0.35,
        max_model_len=1024,
        enforce_eager=False,
        max_num_seqs=256,
        attention_backend="FLASH_ATTN",
    )
    res: dict[str, Any] = {"vllm_config": vcfg.__repr__()}
    t0 = time.perf_counter()
    engine = VLLMEngine(a_dir, vcfg, seed=0)  # first: vLLM forks before CUDA is used here
    res["engine_start_s"] = time.perf_counter() - t0
    res["request_path"] = engine.request_path
    try:
        tok = AutoTokenizer.from_pretrained(a_dir)
        prompts = [tok(p)["input_ids"] for p in PROMPTS]
        await engine.load_weights(a_dir, 0)
        res["reload_idle_A"] = switch_metrics(engine)
        log("engine up; loading learners")
        learners = {
            (w, dt): Learner(d, dt)
            for w, d in (("A", a_dir), ("B", b_dir))
            for dt in ("float32", "bfloat16")
        }
        await agreement(engine, prompts, learners, res, "A", max_new=128)
        await engine.load_weights(b_dir, 1)
        res["reload_idle_B"] = switch_metrics(engine)
        await agreement(engine, prompts, learners, res, "B", max_new=128)
        log("in-flight reloads + publish latency")
        res["inflight"] = await inflight_rounds(engine, prompts, learners, work)
        log("throughput")
        res["throughput"] = await throughput(engine, vocab=len(tok))
    finally:
        await engine.close()
    return res


async def agreement(
    engine: Any,
    prompts: list[Any],
    learners: dict[tuple[str, str], Learner],
    res: dict[str, Any],
    weights: str,
    *,
    max_new: int,
) -> None:
    """res[f"{weights}_T{T}"] = stats vs the learners at `weights` (and the other, as a check)."""
    other = "B" if weights == "A" else "A"
    for temp in TEMPERATURES:
        groups = await sample(engine, prompts, temp, max_new)
        res[f"{weights}_T{temp}"] = {
            "fp32": compare(groups, learners[(weights, "float32")], temp),
            "bf16": compare(groups, learners[(weights, "bfloat16")], temp),
            "bf16_floor": compare_learners(
                groups, learners[(weights, "float32")], learners[(weights, "bfloat16")], temp
            ),
            f"fp32_{other}": compare(groups, learners[(other, "float32")], temp),
        }
        log(f"{weights} T={temp}: {res[f'{weights}_T{temp}']['fp32']}")


_PUBLISHERS: dict[Path, Any] = {}


def publish(model: Any, root: Path, version: int, base_dir: Path) -> tuple[Path, dict[str, Any]]:
    """What the learner does for one snapshot (consumer/snapshots/publisher.py), each part timed:
    `submit_s` the training thread's block (the copy is only enqueued on a side stream),
    `copy_s` until the copy into the pinned buffer is complete, `writer_s` the writer's write +
    hash + finalize, `publish_s` submit until the snapshot is announced. One publisher for every
    round, as in the learner (its host buffers are allocated by the first call)."""
    import torch

    from common.weights import snapshot as snap
    from consumer.snapshots.publisher import Publisher

    if root not in _PUBLISHERS:
        _PUBLISHERS[root] = Publisher(root, base_dir, keep_last=3, on_published=lambda info: None)
    publisher = _PUBLISHERS[root]
    t0 = time.perf_counter()
    fence = publisher.submit(
        model.state_dict(), version=version, step=version, dtype=torch.bfloat16
    )
    t1 = time.perf_counter()
    fence.wait()
    t2 = time.perf_counter()
    publisher.wait()
    t3 = time.perf_counter()
    return snap.snapshot_dir(root, version), {
        "submit_s": t1 - t0,
        "copy_s": t2 - t0,
        "writer_s": publisher.last_write_s,
        "publish_s": t3 - t0,
        "num_superseded": publisher.num_superseded,
    }


async def inflight_rounds(
    engine: Any, prompts: list[Any], learners: dict[tuple[str, str], Learner], work: Path
) -> list[Any]:
    """Three switches B->A->B->A: the learner publishes, then the engine reloads while 32 groups
    are generating. total_s = publish + load_weights (learner step done -> new weights in use)."""
    from producer.engines.base import SamplingParams

    params = SamplingParams(n=G, temperature=1.0, max_new_tokens=256)
    publish(learners[("A", "float32")].model, work / "snaps", 1, work / "q05_a")  # allocations
    rounds = []
    for k in range(3):
        old, new, version = ("B", "A", 2 + k) if k % 2 == 0 else ("A", "B", 2 + k)
        model = learners[(new, "float32")].model
        t0 = time.perf_counter()
        snap_dir, pub = publish(model, work / "snaps", version, work / "q05_a")
        publish_s = time.perf_counter() - t0
        tasks = [asyncio.create_task(engine.generate(p, params)) for p in prompts * 4]
        await asyncio.sleep(0.4)
        in_flight = engine.num_in_flight
        t1 = time.perf_counter()
        await engine.load_weights(snap_dir, version)
        load_s = time.perf_counter() - t1
        pub.update(
            switch_metrics(engine),
            publish_s=publish_s,
            load_weights_s=load_s,
            total_s=publish_s + load_s,
            in_flight=in_flight,
        )
        groups = list(zip(prompts * 4, await asyncio.gather(*tasks), strict=True))
        pub.update(
            compare_split(groups, learners[(old, "float32")], learners[(new, "float32")], version)
        )
        rounds.append(pub)
        log(f"in-flight {old}->{new}: {pub}")
    return rounds


async def throughput(engine: Any, *, vocab: int, reps: int = 2) -> dict[str, Any]:
    """tokens/s of VLLMEngine.generate vs the same AsyncLLM with FINAL_ONLY outputs (n = G).

    Also once through the engine's fallback `stream` path (DELTA outputs), for comparison: the
    bench switches it on by clearing the engine's client-token counter (a private attribute)."""
    import vllm
    from vllm.sampling_params import RequestOutputKind

    from producer.engines.base import SamplingParams
    from producer.engines.vllm import sampling_kwargs

    rng = random.Random(0)
    prompts = [[rng.randrange(1, vocab) for _ in range(64)] for _ in range(64)]
    params = SamplingParams(n=G, temperature=1.0, max_new_tokens=256)
    raw_sp = vllm.SamplingParams(
        **sampling_kwargs(params), output_kind=RequestOutputKind.FINAL_ONLY
    )
    llm, counter = engine.async_llm, iter(range(10**9))

    async def raw_one(p: list[int]) -> int:
        final = None
        async for out in llm.generate({"prompt_token_ids": p}, raw_sp, f"raw-{next(counter)}"):
            final = out
        assert final is not None
        return sum(len(c.token_ids) for c in final.outputs)

    async def ours_one(p: list[int]) -> int:
        return sum(len(c.token_ids) for c in await engine.generate(p, params))

    async def run(fn: Any) -> float:
        t0 = time.perf_counter()
        tokens = sum(await asyncio.gather(*(fn(p) for p in prompts)))
        return float(tokens / (time.perf_counter() - t0))

    await run(ours_one)  # warm-up (CUDA graphs for every batch size, allocator)
    raw, ours = [], []
    for _ in range(reps):
        raw.append(await run(raw_one))
        ours.append(await run(ours_one))
    counter_fn, engine._count = engine._count, None  # the stream path, once
    try:
        stream = await run(ours_one)
    finally:
        engine._count = counter_fn
    return {
        "groups": len(prompts),
        "G": G,
        "max_new_tokens": 256,
        "raw_tok_s": raw,
        "ours_tok_s": ours,
        "stream_path_tok_s": stream,
        "ratio": sum(ours) / sum(raw),
        "stream_ratio": stream * len(raw) / sum(raw),
    }


# ------------------------------------------------------------------------------ demo
def phase_demo_build(work: Path) -> dict[str, Any]:
    """The demo model (work/demo_a) and a perturbed copy (work/demo_b), on the CPU."""
    from transformers import AutoModelForCausalLM

    from launch.demo_model import ensure_demo_model

    t0 = time.perf_counter()
    a_dir = ensure_demo_model(work / "demo_a")
    b_dir = work / "demo_b"
    model = AutoModelForCausalLM.from_pretrained(a_dir)
    perturb_(model, 0.1, seed=2)
    model.save_pretrained(b_dir)
    for f in a_dir.iterdir():  # tokenizer files
        if f.is_file() and not (b_dir / f.name).exists():
            shutil.copy(f, b_dir / f.name)
    return {"build_s": time.perf_counter() - t0}


def phase_demo(work: Path) -> dict[str, Any]:
    """Like `qwen05`: the models come from another process, so vLLM forks its engine from this
    one before CUDA is initialised here (building them here did initialise it)."""
    a_dir, b_dir = work / "demo_a", work / "demo_b"
    res: dict[str, Any] = {}
    if not (b_dir / "config.json").exists():
        cmd = [sys.executable, str(Path(__file__).resolve()), "demo_build", "--work", str(work)]
        if subprocess.run(cmd, cwd=ROOT).returncode != 0:
            return {"error": "demo_build failed (see this phase's log)"}
        res.update(json.loads((work / "demo_build.json").read_text()))
    return asyncio.run(_demo(a_dir, b_dir, res))


async def _demo(a_dir: Path, b_dir: Path, res: dict[str, Any]) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from common.config import VllmConfig
    from common.task.synthetic import ArithmeticTask
    from producer.engines.vllm import VLLMEngine

    vcfg = VllmConfig(
        gpu_memory_utilization=0.15, enforce_eager=True, attention_backend="FLASH_ATTN"
    )
    engine = VLLMEngine(a_dir, vcfg, seed=0)
    try:
        tok = AutoTokenizer.from_pretrained(a_dir)
        task = ArithmeticTask(seed=0)
        prompts = [tok(task.example(i, "train").prompt)["input_ids"] for i in range(32)]
        await engine.load_weights(a_dir, 0)
        learners = {
            (w, dt): Learner(d, dt)
            for w, d in (("A", a_dir), ("B", b_dir))
            for dt in ("float32", "bfloat16")
        }
        await agreement(engine, prompts, learners, res, "A", max_new=8)
        await engine.load_weights(b_dir, 1)
        res["reload_idle_B"] = switch_metrics(engine)
        await agreement(engine, prompts, learners, res, "B", max_new=8)
    finally:
        await engine.close()
    return res


# ------------------------------------------------------------------------------ pipeline
def phase_pipeline(work: Path) -> dict[str, Any]:
    """Consumer and producer as separate processes on one GPU (vLLM with a
    memory fraction, the learner beside it), through the CLI (bench/gpu_pipeline.py): the demo
    model learning the synthetic task, then the 0.5B shape (random weights, so every reward is
    0: zero-variance groups are kept to exercise the whole step)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_pipeline import run as run_pipeline

    from launch.demo_model import ensure_demo_model

    out = work / "pipeline"
    out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {}
    common = ["train.prompts_per_step=16", "producer.max_in_flight=64", "staleness.max_staleness=2"]
    demo = ensure_demo_model(work / "demo_model")
    demo_sets = [*common, "train.lr=1e-4", "sampling.max_new_tokens=8"]
    res["demo"] = run_pipeline(
        demo, out, steps=60, label="demo", sets=demo_sets, timeout_s=200, engine="vllm"
    )
    q05_sets = [
        *common, "sampling.max_new_tokens=256", "train.drop_zero_variance=false",
        "train.micro_batch_tokens=8192", "vllm.max_model_len=1024",
    ]  # fmt: skip
    try:
        res["q05"] = run_pipeline(
            work / "q05_a", out, steps=30, label="q05", sets=q05_sets, timeout_s=240, engine="vllm"
        )
    except Exception as exc:  # the demo result above still counts
        res["q05"] = {"error": repr(exc)[:500]}
    q = res["q05"]
    if "error" not in q:  # the publication targets, 0.5B shape, a snapshot every step
        res["q05_targets"] = {
            "blocked_s_per_publish_max <= 0.05": q["publish_submit_s_max"],
            "step_done_to_generating_s_median <= 1.0": q["reload_delay_s_median"],
            "wall_over_learner_step <= 1.15": q["wall_over_step"],
        }
    return res


def phase_sweep(work: Path) -> dict[str, Any]:
    """`asyncgrpo stress` on one GPU (bench/gpu_sweep.py): max_staleness 0 vs 2 with the learner
    and one colocated vLLM producer on the 0.5B shape; steps/hour and reward at equal
    wall-clock, from the sweep's results.csv."""
    out = work / "sweep"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [
        sys.executable, str(ROOT / "bench" / "gpu_sweep.py"), "--model", str(work / "q05_a"),
        "--out", str(out), "--steps", "20", "--staleness", "0,2", "--timeout", "500",
    ]  # fmt: skip
    code = subprocess.run(cmd, cwd=ROOT, check=False).returncode
    res: dict[str, Any] = json.loads((out / "gpu_sweep.json").read_text())
    if code != 0:
        res["error"] = f"gpu_sweep.py exit {code}: see {out / 'stress.log'}"
    return res


PHASES = {
    "build": phase_build,
    "qwen05": phase_qwen05,
    "demo_build": phase_demo_build,
    "demo": phase_demo,
    "pipeline": phase_pipeline,
    "sweep": phase_sweep,
}


# ------------------------------------------------------------------------------ driver + table
def fmt(s: dict[str, Any] | None) -> str:
    if not s or "mean_abs" not in s:
        return "n/a"
    return (
        f"mean|d|={s['mean_abs']:.4f} max|d|={s['max_abs']:.3f} TIS={s['tis_mean']:.4f} "
        f"trunc={s['frac_truncated']:.4f} n={s['tokens']}"
    )


def table(summary: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    b, q, d = summary.get("build", {}), summary.get("qwen05", {}), summary.get("demo", {})
    rows = [
        (
            "build",
            f"params={b.get('params')} tokenizer={b.get('tokenizer_vocab')} "
            f"{b.get('build_s', 0):.1f}s",
        ),
        (
            "missing imports",
            ", ".join(k for k, v in b.get("imports", {}).items() if v.startswith("MISSING"))
            or "none",
        ),
        (
            "qwen05 engine start",
            f"{q.get('engine_start_s', 0):.1f}s; request path {q.get('request_path')}",
        ),
    ]
    for name, res in (("qwen05", q), ("demo", d)):
        if "skipped" in res:
            rows.append((name, res["skipped"]))
            continue
        for w in ("A", "B"):
            for temp in TEMPERATURES:
                r = res.get(f"{w}_T{temp}", {})
                rows.append((f"{name} {w} T={temp} fp32", fmt(r.get("fp32"))))
                rows.append((f"{name} {w} T={temp} bf16", fmt(r.get("bf16"))))
                rows.append(("  bf16 floor (fp32-bf16)", fmt(r.get("bf16_floor"))))
                other = "B" if w == "A" else "A"
                rows.append((f"  (vs {other}: check)", fmt(r.get(f"fp32_{other}"))))
        if "reload_idle_B" in res:
            rows.append((f"{name} idle reload", json.dumps(res["reload_idle_B"])))
    for i, r in enumerate(q.get("inflight", [])):
        rows.append((f"in-flight #{i} pre/old", fmt(r.get("pre_vs_old"))))
        rows.append((f"in-flight #{i} post/new", fmt(r.get("post_vs_new"))))
        rows.append(
            (
                f"publish+reload #{i}",
                f"submit {r['submit_s']:.4f} (copy done {r['copy_s']:.3f}) writer "
                f"{r['writer_s']:.3f} = publish {r['publish_s']:.3f}; {r['mode']} pause "
                f"{r['pause_s']:.3f} "
                f"(reload {r['reload_s']:.3f}); total {r['total_s']:.3f} s; "
                f"{r['in_flight']} groups in flight",
            )
        )
    tp = q.get("throughput")
    if tp:
        rows.append(
            (
                "throughput tok/s",
                f"raw {[round(x) for x in tp['raw_tok_s']]} "
                f"ours {[round(x) for x in tp['ours_tok_s']]} ratio {tp['ratio']:.3f}; "
                f"stream path {tp['stream_path_tok_s']:.0f} ({tp['stream_ratio']:.3f})",
            )
        )
    rows.append(("pipeline (4d)", json.dumps(summary.get("pipeline", {}))[:3000]))
    for name, r in summary.get("sweep", {}).get("settings", {}).items():
        rows.append(
            (
                f"sweep {name}",
                f"steps/h {r.get('steps_per_hour')} speedup {r.get('speedup_vs_sync')} "
                f"reward@sync-wall {r.get('reward_at_equal_time')} idle "
                f"{r.get('learner_idle_frac')} {r.get('placement')} {r.get('status')}",
            )
        )
    for name, res in summary.items():
        if res.get("rc") not in (0, None):
            rows.append((f"{name} FAILED", f"rc={res['rc']} {res.get('error', '')[:200]}"))
    return rows


def run_phase(name: str, work: Path, out: Path, timeout_s: int) -> dict[str, Any]:
    result_file = work / f"{name}.json"
    result_file.unlink(missing_ok=True)
    t0 = time.perf_counter()
    cmd = [sys.executable, str(Path(__file__).resolve()), name, "--work", str(work)]
    with open(out / f"{name}.log", "w") as logf:
        try:
            rc: int | str = subprocess.run(
                cmd, stdout=logf, stderr=subprocess.STDOUT, timeout=timeout_s, cwd=ROOT
            ).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    res = json.loads(result_file.read_text()) if result_file.exists() else {}
    res.update(rc=rc, wall_s=round(time.perf_counter() - t0, 1))
    log(f"[{name}] rc={rc} wall={res['wall_s']}s")
    if rc != 0:
        print((out / f"{name}.log").read_text()[-4000:], flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("phase", choices=["all", *PHASES])
    ap.add_argument("--phases", default="build,qwen05,demo,pipeline", help="for 'all'")
    ap.add_argument("--work", default="/tmp/bench_vllm")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/bench_vllm/out"))
    ap.add_argument("--timeout", default="build=120,qwen05=300,demo=240,pipeline=540,sweep=560")
    a = ap.parse_args()
    work, out = Path(a.work), Path(a.out)
    work.mkdir(parents=True, exist_ok=True)
    if a.phase != "all":  # one phase, in this process; results to work/<phase>.json
        res: dict[str, Any] = {}
        try:
            res = PHASES[a.phase](work)
        except BaseException as exc:  # keep the traceback in the log and the reason in the table
            import traceback

            traceback.print_exc()
            res["error"] = repr(exc)[:1000]
        (work / f"{a.phase}.json").write_text(json.dumps(res, indent=1, default=str))
        sys.stdout.flush()
        os._exit(1 if "error" in res else 0)  # do not wait for engine threads
    out.mkdir(parents=True, exist_ok=True)
    timeouts = dict(kv.split("=") for kv in a.timeout.split(","))
    summary = {}
    for name in a.phases.split(","):
        summary[name] = run_phase(name, work, out, int(timeouts.get(name, 300)))
        if name == "build" and summary[name]["rc"] != 0:
            break
    (out / "device_vllm.json").write_text(json.dumps(summary, indent=1, default=str))
    print("\n=== bench/device_vllm.py (d = logp_learner - logp_vllm per sampled token) ===")
    for k, v in table(summary):
        print(f"{k:28s} | {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

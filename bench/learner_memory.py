"""The learner's peak resident memory, owner by owner: what a step holds and what it should.

    python bench/learner_memory.py --model models/smollm2-135m-instruct \\
        --config docs/real_model/smollm2.toml [--steps 4] [--malloc default|glibc] [--json PATH]
    python bench/learner_memory.py --model demo            # launch/configs/demo.toml
    python bench/learner_memory.py --model models/smollm2-135m-instruct \\
        --set model.lora.enabled=true                      # the LoRA learner (bench/lora.py)

The learner's own parts, in this process: `DeviceTrainer` on the CPU as the consumer builds it
(the config's model, loss and micro-batching, with `--set KEY=VALUE` overrides), and the
`Publisher` as the learner drives it (a float32 or bfloat16 snapshot after every step, written to
a temporary directory; with LoRA the adapter's tensors only). Every step
trains `train.prompts_per_step` groups of `sampling.group_size` completions: the task's own
prompts, rendered as producers render them, and `sampling.max_new_tokens` random tokens per
completion (the longest a completion can be: the worst step). A sampler thread reads the
resident set (/proc/self/statm) and glibc's bytes in use (`mallinfo2`: arenas and mmapped
chunks) every 2 ms.

Owners of the peak (MB, 2^20 bytes):
- baseline: the process before the model (Python, torch, transformers, the tokenizer);
- weights (all of the policy's: with LoRA the frozen base and the adapter, `trained_mb` of it
  trained), grads, optimizer (AdamW's two moments), host snapshot buffers, the reference model
  (a second copy of the base when `loss.beta > 0` without LoRA): their tensors' bytes;
- activations and logits: the peak bytes in use during a step above those in use before it, once
  the first step made the optimizer state and the gradients (what the forward keeps for the
  backward, the chunked LM head's logits, the gradients' and the optimizer's temporaries);
- allocator slack: the peak resident set (VmHWM) above all of the above (freed memory glibc
  kept, fragments).
The target (docs/real_model.md): peak RSS <= 1.5 x (weights + grads + optimizer + one host
buffer), `peak_over_state`.

`--malloc`: `default` is what the consumer does (consumer/train/host_memory.py: glibc told to
return freed blocks of 1 MiB and more at once); `glibc` leaves glibc's own dynamic thresholds,
which the consumer used before, to measure what the setting changes.

JSON keys (stable): model, layout, steps, threads, malloc, step_s (median), peak_rss_mb,
baseline_mb, weights_mb, trained_mb, lora, gradient_checkpointing, reference_model_mb, grads_mb,
optimizer_mb, host_buffers (count), host_buffer_mb (all of them; 0 when the publisher writes
from the live weights), activations_mb, slack_mb, state_mb (weights + grads + optimizer + one
snapshot-sized host buffer, made or not; with LoRA the snapshot is the adapter),
peak_over_state, rss_after_steps_mb, load_avg_1min.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import config as C
from common import wire
from consumer.data.prompts import make_source
from consumer.snapshots.publisher import Publisher
from consumer.train import host_memory
from consumer.train.trainer import DeviceTrainer
from launch.demo_model import ensure_demo_model
from producer.tokenizer import PromptCodec

ROOT = Path(__file__).resolve().parents[1]
DEMO_CONFIG = ROOT / "launch" / "configs" / "demo.toml"
MB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


_LIBC = ctypes.CDLL("libc.so.6")
_LIBC.mallinfo2.restype = _Mallinfo2


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def in_use_bytes() -> int:
    """Bytes glibc has handed out: small blocks in its arenas plus mmapped chunks."""
    info = _LIBC.mallinfo2()
    return int(info.uordblks + info.hblkhd)


class Sampler:
    """Peak resident set and peak bytes in use, read every `period_s` on its own thread."""

    def __init__(self, period_s: float = 0.002) -> None:
        self.period_s = period_s
        self.peak_rss = self.peak_in_use = self.in_use_at_peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            rss, used = rss_bytes(), in_use_bytes()
            if rss > self.peak_rss:
                self.peak_rss, self.in_use_at_peak_rss = rss, used
            self.peak_in_use = max(self.peak_in_use, used)
            time.sleep(self.period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def task_groups(cfg: C.Config, model_dir: Path, vocab: int, seed: int) -> list[list[wire.Group]]:
    """Steps of groups: the task's prompts in order, completions of the longest length."""
    codec = PromptCodec(model_dir, cfg.task.prompt_format, vocab_size=vocab)
    source = make_source(cfg.task, seed=cfg.run.seed)
    rng = np.random.default_rng(seed)
    G, n, k = cfg.sampling.group_size, cfg.sampling.max_new_tokens, cfg.train.prompts_per_step
    steps, index = [], 0
    for _ in range(8):
        groups = []
        for i in range(k):
            row = source.get(index % len(source))
            index += 1
            prompt = np.array(codec.encode(row.messages or row.prompt), np.int32)
            groups.append(
                wire.Group(
                    lease_id=i,
                    producer_id="bench",
                    prompt_index=i,
                    behavior_version=0,
                    prompt_ids=prompt,
                    completion_ids=rng.integers(3, vocab, G * n).astype(np.int32),
                    completion_lens=np.full(G, n, np.int32),
                    behavior_logp=np.full(G * n, -2.0, np.float32),
                    token_versions=np.zeros(0, np.int32),
                    rewards=(np.arange(G) % 2).astype(np.float32),
                    finish_reasons=("length",) * G,
                    temperature=cfg.sampling.temperature,
                )
            )
        steps.append(groups)
    return steps


def tensor_mb(tensors: Any) -> float:
    return float(sum(t.numel() * t.element_size() for t in tensors)) / MB


def peak_rss_bytes() -> int:
    """The process's peak resident set so far (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure(a: argparse.Namespace) -> dict[str, Any]:
    if a.malloc == "default":
        host_memory.release_freed_blocks()
    model_dir = ensure_demo_model() if a.model == "demo" else Path(a.model)
    config = DEMO_CONFIG if a.model == "demo" else a.config
    cfg = C.override(
        C.apply_overrides(C.load(config), a.set),
        {"model.path": str(model_dir), "model.device": "cpu", "model.torch_threads": a.threads},
    )
    torch.set_num_threads(a.threads)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(model_dir)  # the consumer reads it at start (chat template)
    baseline = rss_bytes()
    trainer = DeviceTrainer(cfg, model_dir)
    steps = task_groups(cfg, model_dir, trainer.vocab_size, a.seed)
    dtype = torch.float32 if cfg.snapshot.dtype == "float32" else torch.bfloat16
    load = os.getloadavg()[0]
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        publisher = Publisher(
            Path(tmp), None, keep_last=1, on_published=lambda _: None, adapter=trainer.adapter
        )
        publisher.submit(trainer.weights(), version=0, step=0, dtype=dtype)
        publisher.wait()
        for s in range(a.steps + 1):  # step 0 makes the optimizer state and the gradients
            if s == 1:
                publisher.wait()
                before = in_use_bytes()  # weights, grads, optimizer, buffer: the state
                sampler = Sampler()
            t0 = time.perf_counter()
            trainer.step(steps[s % len(steps)])
            times.append(time.perf_counter() - t0)
            fence = publisher.submit(trainer.weights(), version=s + 1, step=s + 1, dtype=dtype)
            trainer.hold_weights(fence)
        sampler.stop()
        publisher.close()
        buffers = publisher.num_buffers
        buffer_mb = buffers * publisher.buffer_bytes / MB
    params = list(trainer.model.parameters())
    weights = tensor_mb(params)
    trained = tensor_mb([p for p in params if p.requires_grad])
    grads = tensor_mb([p.grad for p in params if p.grad is not None])
    moments = [v for st in trainer.optimizer.state.values() for v in st.values()]
    optimizer = tensor_mb([v for v in moments if isinstance(v, torch.Tensor) and v.numel() > 1])
    activations = max(sampler.peak_in_use - before, 0) / MB
    peak = peak_rss_bytes() / MB
    # the target's budget counts one snapshot-sized host buffer, whether the publisher made one
    # or wrote from the live weights (float32 on a CPU: none); a LoRA snapshot is the adapter
    published = trained if trainer.adapter else weights
    snapshot_mb = published if dtype == torch.float32 else published / 2
    state = weights + grads + optimizer + (buffer_mb / buffers if buffers else snapshot_mb)
    reference = tensor_mb(trainer.ref_model.parameters()) if trainer.ref_model else 0.0
    owned = baseline / MB + weights + reference + grads + optimizer + buffer_mb + activations
    return {
        "model": str(a.model),
        "layout": trainer.attention.path,
        "steps": a.steps,
        "threads": a.threads,
        "malloc": a.malloc,
        "step_s": statistics.median(times[1:]),
        "peak_rss_mb": peak,
        "baseline_mb": baseline / MB,
        "weights_mb": weights,
        "trained_mb": trained,
        "lora": trainer.adapter is not None,
        "gradient_checkpointing": cfg.model.gradient_checkpointing,
        "reference_model_mb": reference,
        "grads_mb": grads,
        "optimizer_mb": optimizer,
        "host_buffers": buffers,
        "host_buffer_mb": buffer_mb,
        "activations_mb": activations,
        "slack_mb": peak - owned,
        "state_mb": state,
        "peak_over_state": peak / state,
        "rss_after_steps_mb": rss_bytes() / MB,
        "load_avg_1min": load,
    }


def table(r: dict[str, Any]) -> str:
    rows = [
        ("baseline (imports, tokenizer)", r["baseline_mb"]),
        (
            "weights" + (f" ({r['trained_mb']:.0f} MB trained: LoRA)" if r["lora"] else ""),
            r["weights_mb"],
        ),
        ("reference model (loss.beta > 0)", r["reference_model_mb"]),
        ("grads", r["grads_mb"]),
        ("optimizer (AdamW moments)", r["optimizer_mb"]),
        (f"host snapshot buffers ({r['host_buffers']})", r["host_buffer_mb"]),
        ("activations and logits (peak in use)", r["activations_mb"]),
        ("allocator slack and the rest", r["slack_mb"]),
    ]
    lines = [f"{name:40} {mb:8.0f} MB" for name, mb in rows]
    lines.append(f"{'peak RSS':40} {r['peak_rss_mb']:8.0f} MB")
    lines.append(
        f"peak / (weights + grads + optimizer + one buffer = {r['state_mb']:.0f} MB): "
        f"{r['peak_over_state']:.2f}x; step {r['step_s']:.2f} s ({r['layout']}, "
        f"{r['threads']} thread{'s' if r['threads'] != 1 else ''}, malloc {r['malloc']}, "
        f"load {r['load_avg_1min']:.2f})"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo", help="a model directory, or demo")
    ap.add_argument("--config", type=Path, default=ROOT / "docs" / "real_model" / "smollm2.toml")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--malloc", choices=("default", "glibc"), default="default")
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a config override"
    )
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    r = measure(a)
    print(table(r))
    if a.json:
        a.json.write_text(json.dumps(r, indent=1) + "\n")


if __name__ == "__main__":
    main()

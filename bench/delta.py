"""Sparse snapshot deltas over a real training run: delta bytes / full bytes per step, and the
cost of making and applying a delta.

    python bench/delta.py [--steps 30] [--lrs 1e-6,1e-5] [--hidden 256 --layers 4] [--json PATH]

A tiny Qwen2-shaped causal LM (random init, fp32 master weights, tied embeddings) is trained with
AdamW on next-token prediction of a learnable synthetic sequence task (each sequence counts up from
a random start, modulo the vocabulary), one run per learning rate, from the same start. After every
optimizer step the weights are copied into a bf16 publication buffer exactly as the learner
publishes them (consumer/snapshots/weights_buffer.py) and diffed bitwise against the previous step's
(common/weights/delta.py). Adam's update is about `lr` per element whatever the loss, so the
fraction of bf16 values that move per step depends mostly on the learning rate and the weights'
magnitudes: that is what this measures; the GRPO loss itself is not run here.

Reported per learning rate (`lr_<value>`):
- `ratio_per_step`: delta file bytes / snapshot bytes, step 1..N (the delta of step s is on s-1).
- `ratio_median_after_10`, `ratio_max_after_10`: over steps 11..N. Target at lr 1e-6: <= 0.03.
- `diff_s_median`: making the delta (bitwise compare + encode), the publisher's extra work.
- `apply_s_median`: `delta.apply_file` (copy the base file, patch, hash the result) over
  `copy_s_median`, a plain copy of the snapshot file + BLAKE3 of it (what a verified full file
  costs once its bytes are local): `apply_over_copy`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common.weights import delta as D
from common.weights import snapshot as snap
from consumer.snapshots.weights_buffer import HostCopier, HostWeights, table_for, unique_tensors


def build_model(hidden: int, layers: int, vocab: int) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=int(2.75 * hidden) // 8 * 8,
        num_hidden_layers=layers, num_attention_heads=max(hidden // 64, 1),
        num_key_value_heads=max(hidden // 128, 1), tie_word_embeddings=True,
        max_position_embeddings=512,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg)


def batch(vocab: int, rows: int, length: int, gen: torch.Generator) -> torch.Tensor:
    start = torch.randint(0, vocab, (rows, 1), generator=gen)
    return (start + torch.arange(length)) % vocab


def run(lr: float, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    model = build_model(args.hidden, args.layers, args.vocab)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    state = unique_tensors(dict(model.state_dict()))
    table = table_for(state, torch.bfloat16)
    hosts = [HostWeights(table, pin=False) for _ in range(2)]
    copier = HostCopier()
    copier.copy(state, hosts[0])
    gen = torch.Generator().manual_seed(1)
    ratios, diff_s, apply_s, copy_s, losses = [], [], [], [], []
    for step in range(1, args.steps + 1):
        ids = batch(args.vocab, 8, 64, gen)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        prev, cur = hosts[(step - 1) % 2], hosts[step % 2]
        copier.copy(unique_tensors(dict(model.state_dict())), cur)
        base = np.frombuffer(prev.file_bytes(), dtype=np.uint8)
        new = np.frombuffer(cur.file_bytes(), dtype=np.uint8)
        t0 = time.perf_counter()
        layout = D.read_layout(new)
        patches = D.diff(layout, base, new)
        delta = D.Delta(
            step - 1, step, snap.hash_bytes(prev.file_bytes()), snap.hash_bytes(cur.file_bytes()),
            tuple(patches),
        )  # fmt: skip
        header, arrays = D.encode_delta(layout, delta)
        diff_s.append(time.perf_counter() - t0)
        ratios.append(D.delta_bytes(header, arrays) / len(new))
        if step % args.apply_every == 0 or step == args.steps:
            base_path, delta_path = work / "base", work / "delta"
            for p in (base_path, delta_path, work / "out", work / "copy"):
                p.unlink(missing_ok=True)
            snap.write_file(base_path, prev.file_bytes(), fsync=False)
            D.write_delta(delta_path, header, arrays)
            t0 = time.perf_counter()
            D.apply_file(base_path, delta_path, work / "out", base_hash=delta.base_hash)
            apply_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            shutil.copyfile(base_path, work / "copy")
            snap.hash_file(work / "copy")
            copy_s.append(time.perf_counter() - t0)
    tail = ratios[10:] or ratios
    return {
        "ratio_per_step": [round(r, 6) for r in ratios],
        "ratio_median_after_10": statistics.median(tail),
        "ratio_max_after_10": max(tail),
        "diff_s_median": statistics.median(diff_s),
        "apply_s_median": statistics.median(apply_s),
        "copy_s_median": statistics.median(copy_s),
        "apply_over_copy": statistics.median(apply_s) / statistics.median(copy_s),
        "loss_first_last": [losses[0], losses[-1]],
        "full_bytes": table.num_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--lrs", default="1e-6,1e-5", help="comma-separated learning rates")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--apply-every", type=int, default=5, help="time apply every N steps")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 1)))
    out: dict[str, Any] = {"load_avg_1m": os.getloadavg()[0], "steps": args.steps}
    with tempfile.TemporaryDirectory() as tmp:
        for lr in (float(x) for x in args.lrs.split(",")):
            key = f"lr_{lr:g}"
            out[key] = run(lr, args, Path(tmp))
            r = out[key]
            print(
                f"lr {lr:g}: delta/full median after step 10 {r['ratio_median_after_10']:.4f} "
                f"(max {r['ratio_max_after_10']:.4f}); per step "
                f"{' '.join(f'{x:.3f}' for x in r['ratio_per_step'])}; diff "
                f"{r['diff_s_median'] * 1e3:.1f} ms; apply/copy {r['apply_over_copy']:.2f} "
                f"({r['apply_s_median'] * 1e3:.1f} / {r['copy_s_median'] * 1e3:.1f} ms); "
                f"snapshot {r['full_bytes'] / 1e6:.1f} MB"
            )
    out["load_avg_1m_end"] = os.getloadavg()[0]
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

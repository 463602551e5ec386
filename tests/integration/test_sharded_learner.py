"""The sharded learner (FSDP2 under torchrun, gloo on the CPU) against one process on the same
batches: parameters after 1 and 5 steps within 1e-5 (float32), for every aggregation mode and
for packing + gradient checkpointing + two updates per batch + a sharded reference model, and for
kept sets of truncated sampling; the step's loss metrics (gradient norm, tokens, entropy, clip and
TIS figures, kept mass and sizes) alike."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from sharded_steps import CASES, max_diff, run, torchrun

TESTS = Path(__file__).resolve().parents[1]
# metrics that depend on how rows were cut into micro-batches, not on the update
LAYOUT_METRICS = {"padding_frac", "micro_batches", "step_s", "positions_saved_frac", "pass_threads"}


def _compare(model_dir: Path, tmp_path: Path, cases: list[str], steps: int) -> None:
    """Run `cases` on 2 ranks and in this process; parameters and loss metrics agree."""
    args = ["--steps", str(steps), "--record", f"1,{steps}", "--cases", ",".join(cases)]
    torchrun(2, str(TESTS / "sharded_steps.py"), str(model_dir), str(tmp_path / "two"), *args,
             log=tmp_path / "torchrun.log")  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank (OMP_NUM_THREADS=1): quicker on a shared CPU
    try:
        run(model_dir, tmp_path / "one", steps=steps, record={1, steps}, cases=cases)
    finally:
        torch.set_num_threads(threads)
    for name in cases:
        for step in (1, steps):
            file = f"{name}/step{step}.safetensors"
            worst = max_diff(tmp_path / "one" / file, tmp_path / "two" / file)
            assert worst <= 1e-5, (name, step, worst)
            m1 = json.loads((tmp_path / "one" / name / f"step{step}.json").read_text())
            m2 = json.loads((tmp_path / "two" / name / f"step{step}.json").read_text())
            assert m1.keys() == m2.keys()
            for key in m1.keys() - LAYOUT_METRICS:
                if isinstance(m1[key], float):
                    assert m2[key] == pytest.approx(m1[key], rel=1e-4, abs=1e-6), (name, key)
                else:
                    assert m2[key] == m1[key], (name, key)
        one = tmp_path / "one" / name
        assert max_diff(one / "step1.safetensors", one / f"step{steps}.safetensors") > 1e-4


def test_two_ranks_equal_one_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two steps of the default loss, of the packed / checkpointed / two-update / KL case, of
    kept sets and of a LoRA adapter."""
    _compare(
        tiny_model_dir,
        tmp_path,
        ["token-mean", "packed-ckpt-2updates-kl", "top-k-kept-sets", "lora"],
        steps=2,
    )


@pytest.mark.slow  # ~15-30 s; tests/unit/test_loss_variants.py splits rows as ranks do, fast
def test_two_ranks_equal_one_process_with_a_loss_variant(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """GMPO with REINFORCE++-baseline's whitening over kept-set tokens, two updates per batch (so
    that its ratios leave 1); every variant's case runs in the slow five-step test."""
    _compare(tiny_model_dir, tmp_path, ["gmpo-whiten-kept-sets"], steps=2)


@pytest.mark.slow
def test_two_ranks_equal_one_process_every_mode_five_steps(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    _compare(tiny_model_dir, tmp_path, [name for name, _ in CASES], steps=5)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "writer", "reader"),
    [("cosine-warmup", 2, 1), ("cosine-warmup", 1, 2), ("lora", 2, 1), ("lora", 2, 2)],
)
def test_a_checkpoint_resumes_at_another_world_size(
    tiny_model_dir: Path, tmp_path: Path, case: str, writer: int, reader: int
) -> None:
    """Step 1-2 on `writer` ranks, checkpoint (DCP from 2 ranks, safetensors from 1), step 3-4
    on `reader` ranks from it: the same parameters and lr as 4 uninterrupted steps (weights, AdamW
    moments and the scheduler, whose lr differs at every step, all came back). A LoRA learner's
    DCP checkpoint holds the adapter and its moments only (the frozen base is not saved)."""
    cases = [case]
    common = ["--cases", ",".join(cases), "--record", "4"]

    def steps(nproc: int, out: Path, *args: str) -> None:
        if nproc == 1:
            threads = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                run(tiny_model_dir, out, steps=4, record={4}, cases=cases,
                    save_at=2 if "--save-at" in args else 0,
                    resume=Path(args[-1]) if "--resume" in args else None)  # fmt: skip
            finally:
                torch.set_num_threads(threads)
        else:
            torchrun(nproc, str(TESTS / "sharded_steps.py"), str(tiny_model_dir), str(out),
                     "--steps", "4", *common, *args, log=out.with_suffix(".log"))  # fmt: skip

    steps(writer, tmp_path / "first", "--save-at", "2")
    layout = "dcp" if writer > 1 else "model.safetensors"
    assert list((tmp_path / "first" / cases[0] / "run" / "checkpoints").glob(f"*/{layout}"))
    if case == "lora" and writer > 1:  # the adapter's weights and moments only, no base weight
        from torch.distributed.checkpoint import FileSystemReader

        (dcp,) = (tmp_path / "first").rglob("dcp")
        keys = list(FileSystemReader(dcp).read_metadata().state_dict_metadata)
        weights = [k for k in keys if k.startswith("model.")]
        assert weights
        assert [k for k in weights if ".lora_A." not in k and ".lora_B." not in k] == []
    steps(reader, tmp_path / "resumed", "--resume", str(tmp_path / "first"))
    step4 = f"{cases[0]}/step4"
    first, resumed = tmp_path / "first" / step4, tmp_path / "resumed" / step4
    assert max_diff(first.with_suffix(".safetensors"), resumed.with_suffix(".safetensors")) <= 1e-5
    lrs = [json.loads(p.with_suffix(".json").read_text())["lr"] for p in (first, resumed)]
    assert lrs[0] == pytest.approx(lrs[1], rel=1e-12)

"""LoRA end to end in one process: the learner trains the adapter only, publishes it as the
snapshot, the hf engine samples with it (the learner's log-probs to float32 rounding), peft reads
the snapshot directory as it is, and a checkpoint resumes exactly."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from sharded_steps import CASES, batch

from common import config as C
from common import wire
from common.errors import ConfigError
from common.files import run_files as RF
from common.weights import adapter as fmt
from consumer.snapshots.publisher import Publisher
from consumer.train import checkpoint
from consumer.train.trainer import DeviceTrainer
from producer.engines.base import SamplingParams
from producer.engines.hf import HFEngine

PROMPT = [5, 6, 7, 8, 9]


def lora_config(model_dir: Path, **extra: object) -> C.Config:
    values: dict[str, object] = {
        "model.path": str(model_dir),
        "model.device": "cpu",
        "train.lr": 1e-2,
        "model.lora.enabled": True,
        "model.lora.rank": 4,
        "sampling.max_new_tokens": 12,
        "train.prompts_per_step": 3,
        "sampling.group_size": 4,
    }
    return C.override(C.Config(), {**values, **extra})


def publish(trainer: DeviceTrainer, root: Path, version: int, model_dir: Path) -> Path:
    infos: list[wire.SnapshotInfo] = []
    pub = Publisher(
        root, model_dir, keep_last=3, on_published=infos.append, adapter=trainer.adapter
    )
    pub.submit(trainer.weights(), version=version, step=version, dtype=torch.float32)
    pub.close()
    return Path(infos[-1].path).parent


def sample(model_dir: Path, snapshots: list[tuple[Path, int]]) -> list[list]:
    """Completions of PROMPT after loading each snapshot in turn (one engine)."""

    async def main() -> list[list]:
        engine = HFEngine(model_dir, device="cpu")
        out = []
        try:
            for directory, version in snapshots:
                await engine.load_weights(directory, version)
                params = SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=version)
                out.append(await engine.generate(PROMPT, params))
        finally:
            await engine.close()
        return out

    return asyncio.run(main())


def as_group(completions: list, version: int) -> wire.Group:
    n = len(completions)
    return wire.Group(
        lease_id=0,
        producer_id="t",
        prompt_index=0,
        behavior_version=version,
        prompt_ids=np.array(PROMPT, np.int32),
        completion_ids=np.concatenate([c.token_ids for c in completions]).astype(np.int32),
        completion_lens=np.array([len(c.token_ids) for c in completions], np.int32),
        behavior_logp=np.concatenate([c.logprobs for c in completions]).astype(np.float32),
        token_versions=np.zeros(0, np.int32),
        rewards=np.zeros(n, np.float32),
        finish_reasons=tuple(c.finish_reason for c in completions),
        temperature=1.0,
        kept_counts=np.zeros(0, np.int32),
        kept_ids=np.zeros(0, np.int32),
        kept_unknown=np.zeros(0, np.int32),
    )


def test_the_learner_trains_the_adapter_only(tiny_model_dir):
    trainer = DeviceTrainer(lora_config(tiny_model_dir), tiny_model_dir)
    base = {k: v.clone() for k, v in trainer.model.state_dict().items() if "lora_" not in k}
    adapter = {k: v.detach().clone() for k, v in trainer.weights().items()}
    assert adapter
    assert all(k.startswith(fmt.PREFIX) for k in adapter)
    held = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    assert sum(p.numel() for p in held) == sum(v.numel() for v in adapter.values())
    for step in (1, 2):
        trainer.step(batch(step, vocab=trainer.vocab_size))
    after = trainer.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base.items())  # the base never moves
    moved = max(float((trainer.weights()[k] - v).abs().max()) for k, v in adapter.items())
    assert moved > 1e-3
    assert len(trainer.optimizer.state) == len(held)  # AdamW moments for the adapter only


LOSS_CASES = [case for case in CASES if case[0] != "lora"]


@pytest.mark.parametrize(("name", "overrides"), LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
def test_every_loss_mode_trains_the_adapter_only(tiny_model_dir, name, overrides):
    """Each case of the sharded equality test (every aggregation, packing with checkpointing
    and a reference model, schedules, kept sets, GSPO, GMPO, CISPO) runs with an adapter: the
    base stays put, the adapter moves, the metrics are finite."""
    cfg = C.override(lora_config(tiny_model_dir), overrides)
    trainer = DeviceTrainer(cfg, tiny_model_dir)
    base = {k: v.clone() for k, v in trainer.model.state_dict().items() if "lora_" not in k}
    adapter = {k: v.detach().clone() for k, v in trainer.weights().items()}
    for step in (1, 2):
        metrics = trainer.step(batch(step, vocab=trainer.vocab_size, kept=cfg.sampling.top_k))
        assert all(np.isfinite(v) for v in metrics.values() if isinstance(v, float)), name
    after = trainer.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base.items()), name
    assert max(float((trainer.weights()[k] - v).abs().max()) for k, v in adapter.items()) > 0


def test_the_reference_policy_of_a_lora_run_is_the_base_without_a_second_copy(tiny_model_dir):
    """With a KL term the reference is the base: the same model with its adapter off, giving the
    base model's log-probs exactly after the adapter moved; no second model is loaded, and the
    adapter stays the trained state."""
    from consumer.train import adapter as LA

    trainer = DeviceTrainer(lora_config(tiny_model_dir, **{"loss.beta": 0.1}), tiny_model_dir)
    assert trainer.ref_model is None
    trained = [p for p in trainer.model.parameters() if p.requires_grad]
    for step in (1, 2):
        metrics = trainer.step(batch(step, vocab=trainer.vocab_size))
    assert metrics["kl_ref"] > 0  # the adapter moved away from the reference
    groups = batch(3, vocab=trainer.vocab_size)
    with LA.disabled(trainer.model):
        reference = np.concatenate(trainer.logprobs(groups))
    base = DeviceTrainer(C.override(C.Config(), {"model.device": "cpu"}), tiny_model_dir)
    np.testing.assert_array_equal(reference, np.concatenate(base.logprobs(groups)))
    assert np.abs(np.concatenate(trainer.logprobs(groups)) - reference).max() > 1e-4
    assert [p for p in trainer.model.parameters() if p.requires_grad] == trained


def test_the_engine_samples_with_the_learner_s_log_probs_after_two_updates(
    tiny_model_dir, tmp_path
):
    """Exactness at max_staleness 0: the behaviour log-probs of a LoRA snapshot after 2 and 3
    updates equal the learner's to 1e-5 (float32), so the importance ratio is 1."""
    trainer = DeviceTrainer(lora_config(tiny_model_dir), tiny_model_dir)
    published = []
    for step in (1, 2, 3):
        trainer.step(batch(step, vocab=trainer.vocab_size))
        if step >= 2:
            published.append((publish(trainer, tmp_path / "snaps", step, tiny_model_dir), step))
    header = fmt.read_header(published[-1][0] / "model.safetensors")
    assert header == trainer.adapter
    assert header.base_hash == fmt.base_hash(tiny_model_dir)
    # the adapter's bytes are a few percent of the model's (rank 4 of a 64-wide model)
    full = sum(p.numel() * 4 for p in trainer.model.parameters() if not p.requires_grad)
    assert (published[-1][0] / "model.safetensors").stat().st_size < 0.15 * full
    completions = sample(tiny_model_dir, published)
    # the learner's log-probs at version 3 (the last sampled), against the engine's
    learner = trainer.logprobs([as_group(completions[-1], 3)])
    gap = max(
        float(np.abs(a - c.logprobs).max()) for a, c in zip(learner, completions[-1], strict=True)
    )
    assert gap < 1e-5


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_peft_reads_the_snapshot_directory_as_it_is(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer = DeviceTrainer(lora_config(tiny_model_dir), tiny_model_dir)
    for step in (1, 2):
        trainer.step(batch(step, vocab=trainer.vocab_size))
    directory = publish(trainer, tmp_path / "snaps", 2, tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, directory).eval()
    ids = torch.tensor([PROMPT])
    trainer.model.eval()
    with torch.no_grad():
        want = trainer.model(ids).logits
        got = model(ids).logits
    assert float((want - got).abs().max()) < 1e-5


def test_an_adapter_for_another_base_is_refused_and_nothing_changes(tiny_model_dir, tmp_path):
    trainer = DeviceTrainer(lora_config(tiny_model_dir), tiny_model_dir)
    trainer.step(batch(1, vocab=trainer.vocab_size))
    good = publish(trainer, tmp_path / "snaps", 1, tiny_model_dir)
    # the same adapter, its header naming another base
    bad = tmp_path / "bad"
    bad.mkdir()
    tensors = load_file(good / "model.safetensors")
    header = fmt.read_header(good / "model.safetensors")
    assert header is not None
    save_file(tensors, bad / "model.safetensors", metadata=fmt.metadata(header.spec, "0" * 64))

    async def main() -> None:
        engine = HFEngine(tiny_model_dir, device="cpu")
        try:
            await engine.load_weights(good, 1)
            before = {k: v.clone() for k, v in engine.model.state_dict().items()}
            with pytest.raises(fmt.AdapterBaseMismatch, match="another base model"):
                await engine.load_weights(bad, 2)
            assert engine.version == 1
            after = engine.model.state_dict()
            assert all(torch.equal(after[k], v) for k, v in before.items())
        finally:
            await engine.close()

    asyncio.run(main())


def test_a_whole_snapshot_then_an_adapter_applies_it_to_the_base(tiny_model_dir, tmp_path):
    """An engine kept between runs (producer.follow): a whole model's snapshot, then a LoRA
    run's version 0 (B = 0): the engine holds the base again, not the other run's weights."""
    trainer = DeviceTrainer(lora_config(tiny_model_dir), tiny_model_dir)
    adapter_v0 = publish(trainer, tmp_path / "snaps", 0, tiny_model_dir)
    whole = tmp_path / "whole"
    whole.mkdir()
    state = load_file(tiny_model_dir / "model.safetensors")
    save_file({k: v + 0.5 for k, v in state.items()}, whole / "model.safetensors")

    async def main() -> None:
        engine = HFEngine(tiny_model_dir, device="cpu")
        try:
            await engine.load_weights(whole, 7)
            await engine.load_weights(adapter_v0, 0)
            own = engine.model.state_dict()
            assert all(torch.equal(own[k], v) for k, v in state.items() if k in own)
        finally:
            await engine.close()

    asyncio.run(main())


def test_a_lora_checkpoint_holds_the_adapter_and_resumes_exactly(tiny_model_dir, tmp_path):
    cfg = lora_config(tiny_model_dir)
    first = DeviceTrainer(cfg, tiny_model_dir)
    for step in (1, 2):
        first.step(batch(step, vocab=first.vocab_size))
    book = RF.BookState(book={})
    saved = checkpoint.save(tmp_path, trainer=first, version=2, book_state=book)
    stored = load_file(saved / "model.safetensors")
    assert set(stored) == set(first.weights())  # the adapter, not the base model
    for step in (3, 4):
        first.step(batch(step, vocab=first.vocab_size))
    second = DeviceTrainer(cfg, tiny_model_dir)
    assert checkpoint.load(tmp_path, trainer=second)[0] == 2
    for step in (3, 4):
        second.step(batch(step, vocab=second.vocab_size))
    a, b = first.weights(), second.weights()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_target_module_the_model_lacks_is_one_line_before_anything_starts(tiny_model_dir):
    from consumer.train.adapter import check_model

    cfg = lora_config(tiny_model_dir, **{"model.lora.target_modules": ["q_proj", "attn_qkv"]})
    with pytest.raises(ConfigError) as err:
        check_model(cfg.model.lora, tiny_model_dir)
    assert "no linear module named 'attn_qkv'" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="attn_qkv"):
        DeviceTrainer(cfg, tiny_model_dir)
    # lm_head is never a target (the chunked head reads its weight directly)
    with pytest.raises(ConfigError, match="'lm_head'"):
        check_model(
            lora_config(tiny_model_dir, **{"model.lora.target_modules": ["lm_head"]}).model.lora,
            tiny_model_dir,
        )


def lora_run(model_dir: Path, run_dir: Path, steps: int = 2) -> DeviceTrainer:
    """A run directory as a LoRA learner leaves it: config.toml, snapshots v0..v`steps`,
    final.json."""
    from common.weights import snapshot as snap

    cfg = lora_config(model_dir, **{"run.dir": str(run_dir)})
    run_dir.mkdir()
    C.write(cfg, run_dir / RF.CONFIG)
    trainer = DeviceTrainer(cfg, model_dir)
    for step in range(1, steps + 1):
        trainer.step(batch(step, vocab=trainer.vocab_size))
        publish(trainer, run_dir / RF.SNAPSHOTS, step, model_dir)
    snap.write_final(run_dir, steps)
    trainer.model.eval()
    return trainer


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_export_writes_a_merged_model_and_the_bare_adapter(tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from consumer.evaluation.greedy import load_model
    from launch.export import export

    trainer = lora_run(tiny_model_dir, tmp_path / "run")
    done = export(tmp_path / "run", tmp_path / "out")
    assert (done.version, done.adapter) == (2, True)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        want = trainer.model(ids).logits
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        bare = PeftModel.from_pretrained(base, tmp_path / "out" / "adapter")
        evaluated, _ = load_model(tiny_model_dir, tmp_path / "run" / "snapshots" / "v000002")
        for model in (merged, bare, evaluated):
            assert float((model.eval()(ids).logits - want).abs().max()) < 1e-5
    assert (tmp_path / "out" / "tokenizer_config.json").exists()
    # an earlier version on request; an existing --out and a version not on disk refused
    assert export(tmp_path / "run", tmp_path / "v1", version=1).version == 1
    with pytest.raises(ConfigError, match="already exists"):
        export(tmp_path / "run", tmp_path / "out")
    with pytest.raises(ConfigError, match="no snapshot v9 on disk"):
        export(tmp_path / "run", tmp_path / "v9", version=9)


def test_export_and_eval_refuse_an_adapter_of_another_base(tiny_model_dir, tmp_path):
    from consumer.evaluation.greedy import load_model
    from launch.export import export

    lora_run(tiny_model_dir, tmp_path / "run", steps=1)
    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    state = load_file(other / "model.safetensors")
    save_file({k: v * 2 for k, v in state.items()}, other / "model.safetensors")
    cfg = C.load(tmp_path / "run" / RF.CONFIG)
    C.write(C.override(cfg, {"model.path": str(other)}), tmp_path / "run" / RF.CONFIG)
    with pytest.raises(fmt.AdapterBaseMismatch, match="another base model"):
        export(tmp_path / "run", tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(fmt.AdapterBaseMismatch):
        load_model(other, tmp_path / "run" / "snapshots" / "v000001")


@pytest.mark.parametrize(
    ("command", "setting", "message"),
    [
        ("launch", 'model.lora.target_modules=["q_proj","attn_qkv"]', "no linear module named"),
        ("stress", "model.lora.rank=-1", "model.lora.rank = -1: must be >= 1"),
    ],
)
def test_bad_lora_input_is_one_line_and_nothing_starts(
    tiny_model_dir, tmp_path, command, setting, message
):
    import subprocess
    import sys

    out = tmp_path / "run"
    where = ["--run-dir", str(out)] if command == "launch" else ["--out", str(out)]
    sets = ["--set", f"model.path={tiny_model_dir}", "--set", "model.lora.enabled=true"]
    done = subprocess.run(
        [sys.executable, "-m", "launch.cli", command, *where, *sets, "--set", setting],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1
    assert message in errors[0]
    assert "Traceback" not in done.stderr
    assert not out.exists()


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_is_on_when_asked_and_changes_no_number(tiny_model_dir, lora):
    """`model.gradient_checkpointing` really recomputes (transformers 5 names the switch
    `activation_checkpointing_enable`), with or without an adapter, and the step is the same."""
    cfg = lora_config(tiny_model_dir, **{"model.lora.enabled": lora})
    plain = DeviceTrainer(cfg, tiny_model_dir)
    ckpt = DeviceTrainer(C.override(cfg, {"model.gradient_checkpointing": True}), tiny_model_dir)
    layers = ckpt.model.get_decoder().layers
    assert all(layer.gradient_checkpointing for layer in layers)
    assert not any(layer.gradient_checkpointing for layer in plain.model.get_decoder().layers)
    a = plain.step(batch(1, vocab=plain.vocab_size))
    b = ckpt.step(batch(1, vocab=ckpt.vocab_size))
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    assert b["grad_norm"] > 0
    wa, wb = plain.weights(), ckpt.weights()
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-6


def test_a_one_process_lora_checkpoint_is_refused_on_several_ranks(tiny_model_dir, tmp_path):
    """Resuming a one-process LoRA checkpoint sharded is not built: one line, before any read."""
    from consumer.train import sharded_checkpoint

    trainer = DeviceTrainer(lora_config(tiny_model_dir), tiny_model_dir)
    trainer.step(batch(1, vocab=trainer.vocab_size))
    book = RF.BookState(book={})
    saved = checkpoint.save(tmp_path, trainer=trainer, version=1, book_state=book)
    assert not sharded_checkpoint.is_sharded(saved)
    with pytest.raises(ConfigError, match="resumes in one process"):
        sharded_checkpoint.load_full(
            trainer.model, trainer.optimizer, trainer.scheduler, saved, main=True
        )

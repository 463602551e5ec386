"""The learner's forward on a GPU: the chunked head under bf16 autocast and its memory, and the
packed layouts (flex_attention, flash-attn varlen when installed) against the padded one.

Run on a CUDA machine: `pytest -m gpu tests/gpu/test_learner_gpu.py` (flash-attn optional)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from common import config as C
from common import wire
from common.sampling.logprobs import entropy_from_logits, sampled_logprobs
from consumer.train import attention as A
from consumer.train.lm_head import chunk_rows_for, chunked_logprobs
from consumer.train.trainer import DeviceTrainer

pytestmark = [
    pytest.mark.gpu,
    # torch 2.11's dynamo reads `.grad` of the non-leaf query/key/value it wraps when it compiles
    # flex attention (transformers' compile_friendly_flex_attention): a UserWarning, harmless,
    # that the suite's "error" filter would turn into a failed compile
    pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf"),
]
V, H = 151936, 896  # Qwen2.5-0.5B's head


def test_the_chunked_head_under_autocast_matches_full_bf16_logits():
    gen = torch.Generator(device="cuda").manual_seed(0)
    n = 3000
    h = torch.randn(n, H, device="cuda", generator=gen).requires_grad_(True)
    w = (torch.randn(V, H, device="cuda", generator=gen) * 0.05).requires_grad_(True)
    y = torch.randint(V, (n,), device="cuda", generator=gen)
    with torch.autocast("cuda", torch.bfloat16):
        logp, ent = chunked_logprobs(
            h, w, None, y, temperature=0.7, chunk_rows=chunk_rows_for(V, 256),
            compute_dtype=torch.bfloat16,
        )  # fmt: skip
        logits = torch.nn.functional.linear(h, w).float()  # the path it replaces
    ref = sampled_logprobs(logits, y, temperature=0.7)
    # the same bf16 products, possibly from other GEMM kernels (chunks are smaller matrices):
    # a logit may round to a neighbouring bf16 value, nothing more
    assert (logp - ref).abs().max() < 0.05
    assert (logp - ref).abs().mean() < 2e-3
    ent_ref = entropy_from_logits(logits, temperature=0.7)
    assert (ent - ent_ref).abs().max() < 0.05
    got = torch.autograd.grad(logp.sum(), (h, w))
    want = torch.autograd.grad(ref.sum(), (h, w))
    for g, r in zip(got, want, strict=True):
        assert (g - r).norm() <= 2e-2 * r.norm()


@pytest.mark.parametrize("n", [16384, 65536])
def test_the_chunked_head_stays_within_two_gib(n):
    """Forward and backward over n positions at Qwen's vocabulary: peak above the start <= 2 GiB
    (full float32 logits alone would be n * V * 4 bytes: 9.3 GiB at 16384)."""
    h = torch.randn(n, H, device="cuda", requires_grad=True)
    w = torch.randn(V, H, device="cuda", requires_grad=True)
    y = torch.randint(V, (n,), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    with torch.autocast("cuda", torch.bfloat16):
        logp, _ = chunked_logprobs(
            h, w, None, y, temperature=1.0, chunk_rows=chunk_rows_for(V, 256),
            compute_dtype=torch.bfloat16,
        )  # fmt: skip
    logp.sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - start
    assert peak <= 2 * 2**30, f"{peak / 2**30:.2f} GiB"


def _groups(vocab: int, seed: int = 0) -> list[wire.Group]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(4):
        lens = rng.integers(8, 200, 8).astype(np.int32)
        out.append(
            wire.Group(
                lease_id=i, producer_id="g", prompt_index=i, behavior_version=0,
                prompt_ids=rng.integers(2, vocab, int(rng.integers(16, 100))).astype(np.int32),
                completion_ids=rng.integers(2, vocab, int(lens.sum())).astype(np.int32),
                completion_lens=lens, behavior_logp=np.full(int(lens.sum()), -3.0, np.float32),
                token_versions=np.zeros(0, np.int32), rewards=rng.random(8).astype(np.float32),
                finish_reasons=("stop",) * 8, temperature=1.0,
            )
        )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("learner-gpu"), hidden=128, layers=2)


def _trainer(model_dir: Path, attention: str, dtype: str) -> DeviceTrainer:
    cfg = C.override(
        C.Config(),
        {"model.device": "cuda", "model.attention": attention, "model.dtype": dtype,
         "train.micro_batch_tokens": 1024},
    )  # fmt: skip
    return DeviceTrainer(cfg, model_dir)


PACKED = ["flex"] + (["flash"] if A.installed_flash() else [])


@pytest.mark.parametrize("attention", PACKED)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_packed_rows_give_the_padded_log_probs_and_step(model_dir, attention, dtype):
    if attention == "flash" and dtype == "float32":
        pytest.skip("flash-attn runs in half precision only")
    padded, packed = _trainer(model_dir, "padded", dtype), _trainer(model_dir, attention, dtype)
    groups = _groups(padded.vocab_size)
    tol = 1e-4 if dtype == "float32" else 5e-2
    for a, b in zip(padded.logprobs(groups), packed.logprobs(groups), strict=True):
        np.testing.assert_allclose(b, a, atol=tol, rtol=tol)
    m_padded, m_packed = padded.step(groups), packed.step(groups)
    assert m_packed["attention"] == attention
    assert m_packed["padding_frac"] == 0.0 < m_padded["padding_frac"]
    assert m_packed["grad_norm"] == pytest.approx(m_padded["grad_norm"], rel=10 * tol)
    for (name, p), q in zip(
        padded.model.named_parameters(), packed.model.parameters(), strict=True
    ):
        torch.testing.assert_close(q, p, rtol=10 * tol, atol=1e-3, msg=name)


def test_auto_picks_a_packed_path_on_cuda(model_dir):
    trainer = _trainer(model_dir, "auto", "bfloat16")
    assert trainer.attention.packed
    assert trainer.attention.path == ("flash" if A.installed_flash() else "flex")
    m = trainer.step(_groups(trainer.vocab_size, seed=1))
    assert m["attention"] == trainer.attention.path
    assert np.isfinite(m["grad_norm"])


def test_bf16_learner_matches_the_float32_learner_to_bf16_precision(model_dir):
    fp32 = _trainer(model_dir, "padded", "float32")
    groups = _groups(fp32.vocab_size, seed=2)
    bf16 = _trainer(model_dir, "auto", "bfloat16")
    gap = np.concatenate(
        [a - b for a, b in zip(fp32.logprobs(groups), bf16.logprobs(groups), strict=True)]
    )
    assert np.abs(gap).mean() < 0.05

"""The vLLM engine on a real GPU: contract, log-prob agreement across reloads, in-flight versions,
and truncated sampling (kept sets from processed log-probs, renormalised by the learner).

One engine for the module (starting vLLM takes seconds), on a small random Qwen2 with heads of 64 (a
size FlashAttention takes) and a perturbed copy of it. The engine starts before this process touches
CUDA, so vLLM can fork its engine process. The reference ("learner") is a transformers float32
forward of the same weights through `common.sampling.logprobs.sampled_logprobs` at the sampling
temperature; vLLM runs bf16, so agreement is at bf16 noise (mean |Δ| < 0.02).

Run on a CUDA machine with vllm installed: `pytest -m gpu tests/gpu/test_vllm_engine.py`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # conftest's check: no CUDA init
if importlib.util.find_spec("vllm") is None:
    pytest.skip("vllm is not installed", allow_module_level=True)

from common.config import VllmConfig
from common.sampling.kept_set import Truncation
from producer.engines.base import Completion, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.asyncio(loop_scope="module"),
    # vLLM and its dependencies warn on import and start-up; those are not this project's.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]
TOL = 0.02
MAX_KEPT = 16  # below the tiny vocabulary (47): the cap binds, and N = 17 candidates < V


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(A, B): a random Qwen2 (hidden 128, 2 heads of 64) and a perturbed copy, float32."""
    import torch
    from tiny_models import build_tiny_model
    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("vllm-models")
    a_dir = build_tiny_model(root / "a", hidden=128, layers=2)
    model = AutoModelForCausalLM.from_pretrained(a_dir)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.3 * float(p.std()))
    b_dir = build_tiny_model(root / "b", hidden=128, layers=2)  # tokenizer and config
    model.save_pretrained(b_dir)
    return a_dir, b_dir


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(model_dirs: tuple[Path, Path]) -> AsyncIterator[Any]:
    from producer.engines.vllm import VLLMEngine

    vcfg = VllmConfig(gpu_memory_utilization=0.2, enforce_eager=True, max_model_len=256)
    # started for truncated sampling (max_logprobs = MAX_KEPT + 1); untruncated requests ask
    # for the sampled token's log-prob only, as always
    eng = VLLMEngine(
        model_dirs[0], vcfg, seed=0, truncation=Truncation(top_p=0.9, max_kept=MAX_KEPT)
    )
    yield eng
    await eng.close()


class Learner:
    def __init__(self, path: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(path).cuda().eval()

    def logprobs(self, prompt: list[int], c: Completion, temperature: float) -> np.ndarray:
        import torch

        from common.sampling.logprobs import sampled_logprobs

        ids = torch.tensor([prompt + c.token_ids.tolist()], device="cuda")
        with torch.no_grad():
            logits = self.model(ids).logits[:, len(prompt) - 1 : -1]
            lp = sampled_logprobs(logits, ids[:, len(prompt) :], temperature=temperature)
        return lp[0].double().cpu().numpy()


@pytest.fixture(scope="module")
def learners(engine: Any, model_dirs: tuple[Path, Path]) -> dict[str, Learner]:
    """Built after the engine: CUDA in this process only once vLLM has forked."""
    return {"A": Learner(model_dirs[0]), "B": Learner(model_dirs[1])}


def mean_abs_delta(learner: Learner, prompt: list[int], out: list[Completion], t: float) -> float:
    d = [learner.logprobs(prompt, c, t) - c.logprobs for c in out]
    return float(np.abs(np.concatenate(d)).mean())


async def test_a_real_engine_keeps_the_contract(engine: Any, model_dirs: tuple[Path, Path]):
    assert engine.request_path == "final"  # vLLM 0.24 exposes its client-side token counts
    await engine.load_weights(model_dirs[0], 0)
    stops = (1, 2, 3, 4, 5)
    params = SamplingParams(n=16, temperature=0.9, max_new_tokens=12, seed=3, stop_token_ids=stops)
    out = await engine.generate([6, 7, 8], params)
    assert len(out) == 16
    for c in out:
        assert c.token_ids.dtype == np.int32
        assert c.logprobs.dtype == np.float32
        assert c.versions.dtype == np.int32
        assert 1 <= len(c.token_ids) == len(c.logprobs) == len(c.versions) <= 12
        assert np.isfinite(c.logprobs).all()
        assert (c.logprobs <= 0).all()
        assert ((c.token_ids >= 0) & (c.token_ids < engine.vocab_size)).all()
        assert (c.versions == 0).all()
        if c.finish_reason == "stop":
            assert int(c.token_ids[-1]) in stops
            assert not set(c.token_ids[:-1].tolist()) & set(stops)
        else:
            assert c.finish_reason == "length"
            assert len(c.token_ids) == 12
    assert {c.finish_reason for c in out} == {"stop", "length"}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_logprobs_match_the_learner_before_and_after_a_reload(
    engine: Any, model_dirs: tuple[Path, Path], learners: dict[str, Learner], temperature: float
):
    prompt = [6, 7, 8, 9]
    params = SamplingParams(n=16, temperature=temperature, max_new_tokens=48)
    await engine.load_weights(model_dirs[0], 0)
    out_a = await engine.generate(prompt, params)
    await engine.load_weights(model_dirs[1], 1)
    assert engine.last_mode == "idle"
    out_b = await engine.generate(prompt, params)
    assert all((c.versions == 1).all() for c in out_b)
    assert mean_abs_delta(learners["A"], prompt, out_a, temperature) < TOL
    assert mean_abs_delta(learners["B"], prompt, out_b, temperature) < TOL
    assert mean_abs_delta(learners["A"], prompt, out_b, temperature) > 5 * TOL  # B is loaded


async def test_inflight_update_versions_name_the_weights_that_sampled_each_token(
    engine: Any, model_dirs: tuple[Path, Path], learners: dict[str, Learner]
):
    await engine.load_weights(model_dirs[1], 1)
    prompts = [[6 + i % 30, 7, 8] for i in range(32)]
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=240)
    tasks = [asyncio.create_task(engine.generate(p, params)) for p in prompts]
    await asyncio.sleep(0.3)
    await engine.load_weights(model_dirs[0], 2)
    assert engine.last_mode == "inflight"
    assert engine.last_pause_s < 2.0
    groups = await asyncio.gather(*tasks)
    pre, post = [], []
    for prompt, out in zip(prompts, groups, strict=True):
        for c in out:
            assert set(c.versions.tolist()) <= {1, 2}
            assert (np.diff(c.versions) >= 0).all()
            new = c.versions == 2
            pre.append((learners["B"].logprobs(prompt, c, 1.0) - c.logprobs)[~new])
            post.append((learners["A"].logprobs(prompt, c, 1.0) - c.logprobs)[new])
    pre_d, post_d = np.concatenate(pre), np.concatenate(post)
    assert pre_d.size > 0
    assert post_d.size > 0
    assert np.abs(pre_d).mean() < TOL
    assert np.abs(post_d).mean() < TOL


async def test_a_snapshot_the_publisher_wrote_from_cuda_weights_loads_in_vllm(
    engine: Any, model_dirs: tuple[Path, Path], learners: dict[str, Learner], tmp_path: Path
):
    """The learner's publication path end to end: B's CUDA weights copied on a side stream into
    pinned memory, written as bf16 safetensors with the header from the tensor table, loaded by
    vLLM's `reload_weights`, sampling what the learner computes."""
    import torch

    from common.wire import SnapshotInfo
    from consumer.snapshots.publisher import Publisher

    published: list[SnapshotInfo] = []
    publisher = Publisher(tmp_path, model_dirs[1], keep_last=2, on_published=published.append)
    publisher.submit(learners["B"].model.state_dict(), version=7, step=7, dtype=torch.bfloat16)
    publisher.close()
    await engine.load_weights(model_dirs[0], 6)
    await engine.load_weights(Path(published[0].path).parent, 7)
    prompt = [6, 7, 8, 9]
    out = await engine.generate(prompt, SamplingParams(n=16, temperature=1.0, max_new_tokens=48))
    assert all((c.versions == 7).all() for c in out)
    assert mean_abs_delta(learners["B"], prompt, out, 1.0) < TOL
    assert mean_abs_delta(learners["A"], prompt, out, 1.0) > 5 * TOL


@pytest.mark.parametrize(
    "truncation",
    [
        Truncation(top_p=0.9, max_kept=MAX_KEPT),
        Truncation(top_k=8, max_kept=MAX_KEPT),
        Truncation(top_k=12, top_p=0.8, min_p=0.05, max_kept=MAX_KEPT),
    ],
    ids=["top_p", "top_k", "all_three"],
)
async def test_truncated_sampling_records_the_kept_sets_the_learner_renormalises_over(
    engine: Any, model_dirs: tuple[Path, Path], learners: dict[str, Learner], truncation: Truncation
):
    """Each token's kept set (sampled id ∪ finite processed candidates) holds the token and at
    most max_kept ids; the learner's log π_K over it is vLLM's log q to bf16 noise, while the
    full-vocabulary log-prob falls short by log S; unknown sets (ties beyond max_kept, a -inf
    sampled entry) stay rare."""
    import torch

    from common.sampling.logprobs import kept_set_logprobs

    await engine.load_weights(model_dirs[0], 0)
    prompts = [[6 + i, 7, 8] for i in range(8)]  # 64 rows: vLLM's Triton top-k/top-p kernels
    params = SamplingParams(n=8, temperature=0.9, max_new_tokens=24, truncation=truncation)
    groups = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    kept_d, full_d, sizes, unknown, total = [], [], [], 0, 0
    learner = learners["A"]
    for prompt, out in zip(prompts, groups, strict=True):
        for c in out:
            k = c.kept
            assert k.present
            total += len(c.token_ids)
            unknown += len(k.unknown)
            trained = k.trained(len(c.token_ids))
            sets = [
                [int(c.token_ids[t]), *k.ids[k.offsets[t] : k.offsets[t + 1]].tolist()]
                for t in range(len(c.token_ids))
            ]
            assert all(len(s) <= MAX_KEPT for s in sets)
            ids = torch.tensor([prompt + c.token_ids.tolist()], device="cuda")
            with torch.no_grad():
                logits = learner.model(ids).logits[0, len(prompt) - 1 : -1].double()
            width = max(len(s) for s in sets)
            kept_NK = torch.zeros(len(sets), width, dtype=torch.long, device="cuda")
            valid_NK = torch.zeros_like(kept_NK, dtype=torch.bool)
            for t, s in enumerate(sets):
                kept_NK[t, : len(s)] = torch.tensor(s)
                valid_NK[t, : len(s)] = True
            log_k = kept_set_logprobs(logits, kept_NK, valid_NK, temperature=0.9).cpu().numpy()
            log_full = learner.logprobs(prompt, c, 0.9)
            kept_d.append((log_k - c.logprobs)[trained])
            full_d.append((log_full - c.logprobs)[trained])
            sizes += [len(s) for s, known in zip(sets, trained, strict=True) if known]
    kept_gap, full_gap = np.concatenate(kept_d), np.concatenate(full_d)
    print(  # the figures docs/sampling.md quotes for the vLLM path (run with -s)
        f"vllm kept sets {truncation}: tokens {total}, unknown {unknown}, mean |K| "
        f"{np.mean(sizes):.2f}, mean |d| kept {np.abs(kept_gap).mean():.4f}, ratio kept "
        f"{np.exp(kept_gap).mean():.4f}, ratio full vocab {np.exp(full_gap).mean():.4f}"
    )
    assert unknown <= 0.05 * total, (unknown, total)
    assert np.abs(kept_gap).mean() < TOL
    assert abs(np.exp(kept_gap).mean() - 1) < TOL  # the ratio at the behaviour policy
    assert np.exp(full_gap).mean() < 1 - 5 * TOL  # the naive ratio carries the kept mass S
    assert 1 < np.mean(sizes) <= MAX_KEPT

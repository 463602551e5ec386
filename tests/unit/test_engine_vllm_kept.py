"""CPU tests of truncated sampling with the vllm engine (producer/engines/vllm_kept.py): request
and engine arguments, the release check, kept sets and log q from fake processed log-probs (every
way a position's kept set can be unknown), and a truncated generation through the engine with
tests/unit/test_engine_vllm.py's stand-ins for vLLM's AsyncLLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_engine_vllm import (
    INF,
    K789,
    LOG,
    CompletionOutput,
    FakeAsyncLLM,
    FakeFinalAsyncLLM,
    RequestOutput,
    flat,
    write_checkpoint,
)

from common.config import VllmConfig
from common.sampling import kept_set
from common.sampling.kept_set import Truncation
from producer.engines import vllm_kept
from producer.engines.base import SamplingParams
from producer.engines.vllm import VLLMEngine, engine_kwargs, sampling_kwargs
from producer.engines.vllm_outputs import RequestTrack

TOP_K_4 = Truncation(top_k=4, max_kept=4)  # N = 5 candidates per position


@pytest.fixture
def base_dir(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "v0")


@pytest.fixture(params=[FakeAsyncLLM, FakeFinalAsyncLLM], ids=["stream", "final"])
def fake(request: pytest.FixtureRequest) -> type[FakeAsyncLLM]:
    return request.param  # type: ignore[no-any-return]


def test_truncated_requests_ask_for_max_kept_plus_one_candidates_and_bound_top_k():
    params = SamplingParams(4, 0.7, 32, truncation=Truncation(top_p=0.9, min_p=0.1, max_kept=64))
    kw = sampling_kwargs(params, vocab_size=1000)
    assert (kw["top_p"], kw["top_k"], kw["min_p"], kw["logprobs"]) == (0.9, 64, 0.1, 65)
    assert kw["flat_logprobs"] is True
    kw = sampling_kwargs(
        SamplingParams(4, 0.7, 32, truncation=Truncation(top_k=20)), vocab_size=1000
    )
    assert (kw["top_p"], kw["top_k"], kw["logprobs"]) == (1.0, 20, 257)
    small = sampling_kwargs(params, vocab_size=50)  # the whole vocabulary fits: no top-k, N = V
    assert (small["top_k"], small["logprobs"]) == (0, 50)


def test_the_engine_raises_max_logprobs_for_truncated_sampling(base_dir: Path):
    (base_dir / "config.json").write_text(json.dumps({"vocab_size": 1000}))
    assert "max_logprobs" not in engine_kwargs(base_dir, VllmConfig(), seed=0)
    kw = engine_kwargs(base_dir, VllmConfig(), seed=0, truncation=Truncation(top_p=0.9))
    assert kw["max_logprobs"] == 257
    kw = engine_kwargs(base_dir, VllmConfig(), seed=0, truncation=Truncation(top_k=3, max_kept=3))
    assert kw["max_logprobs"] == 20  # never below vLLM's default


@pytest.mark.parametrize("version", ["0.24.0", "0.24.1", "0.28.0+cu128", "1.0.0rc1"])
def test_vllm_from_0_24_records_kept_sets(version: str):
    assert vllm_kept.support_problem(version) is None


@pytest.mark.parametrize("version", ["0.23.1", "0.10.2", "0.11.0.dev5"])
def test_an_older_vllm_is_refused_for_truncated_sampling_naming_the_release_that_can(version):
    problem = vllm_kept.support_problem(version)
    assert problem is not None
    assert "needs vLLM >= 0.24.0" in problem
    assert version in problem
    assert "sampling.top_p" in problem


@pytest.mark.parametrize("ends", [True, False])
def test_kept_sets_and_log_q_come_from_the_finite_candidates(ends: bool):
    positions = [
        [(7, LOG(0.5)), *K789],  # K = {7, 8, 9}
        [(9, LOG(0.2)), *K789],  # another sampled token, same K
        [(3, 0.0), (3, 0.0), (0, -INF), (1, -INF), (2, -INF), (4, -INF)],  # K = {3}
    ]
    log_q, others, unknown = vllm_kept.kept_sets([7, 9, 3], flat(positions, ends=ends), TOP_K_4, 50)
    assert log_q == pytest.approx([LOG(0.5), LOG(0.2), 0.0])
    assert [o.tolist() for o in others] == [[8, 9], [7, 8], []]
    assert unknown == []


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([(7, LOG(0.5)), (7, -1.6), (8, -1.6), (9, -1.6), (10, -1.6), (11, -1.6)], "all N finite"),
        ([(7, -INF), *K789], "sampled not finite"),
        ([(7, LOG(0.5)), (8, LOG(0.6)), (9, LOG(0.4)), (0, -INF), (1, -INF), (2, -INF)],
         "sampled not among the candidates"),
        ([(7, LOG(0.5)), (7, LOG(0.5)), (8, LOG(0.3)), (0, -INF), (1, -INF), (2, -INF)],
         "does not sum to 1: a candidate missing"),
        ([(8, LOG(0.3)), *K789], "the first entry is not the sampled token"),
    ],
)  # fmt: skip
def test_a_position_whose_kept_set_is_not_known_exactly_is_marked_unknown(entries, why):
    good = [(7, LOG(0.5)), *K789]
    log_q, others, unknown = vllm_kept.kept_sets([7, 7], flat([good, entries]), TOP_K_4, 50)
    assert unknown == [1], why
    assert log_q[1] == 0.0
    assert len(others[1]) == 0
    assert [o.tolist() for o in others[:1]] == [[8, 9]]


def test_when_the_candidates_cover_the_vocabulary_all_finite_is_complete():
    vocab = 4
    trunc = Truncation(min_p=0.01, max_kept=8)  # N = min(9, V) = 4 = V
    entries = [(1, LOG(0.4)), (1, LOG(0.4)), (2, LOG(0.3)), (0, LOG(0.2)), (3, LOG(0.1))]
    _, others, unknown = vllm_kept.kept_sets([1], flat([entries]), trunc, vocab)
    assert unknown == []
    assert others[0].tolist() == [0, 2, 3]


def test_a_track_keeps_kept_sets_across_deltas_with_unknown_positions_shifted():
    track = RequestTrack(1, 0, truncation=TOP_K_4, vocab_size=50)
    bad = [(7, -INF), *K789]
    track.add(RequestOutput("r", [CompletionOutput(0, [7], flat([[(7, LOG(0.5)), *K789]]))]))
    track.add(
        RequestOutput(
            "r", [CompletionOutput(0, [7, 9], flat([bad, [(9, LOG(0.2)), *K789]]), "stop")]
        )
    )
    (c,) = track.completions()
    assert c.token_ids.tolist() == [7, 7, 9]
    assert c.logprobs.tolist() == pytest.approx([LOG(0.5), 0.0, LOG(0.2)])
    assert c.kept.offsets.tolist() == [0, 2, 2, 4]
    assert c.kept.ids.tolist() == [8, 9, 7, 8]
    assert c.kept.unknown.tolist() == [1]
    assert kept_set.encoding_problem(c.kept, c.token_ids, vocab_size=50, max_kept=4) is None


async def test_a_truncated_generation_through_the_engine_carries_kept_sets(base_dir, fake):
    engine = VLLMEngine(
        base_dir, VllmConfig(), llm=fake(), truncation=TOP_K_4,
        make_sampling=lambda kw, stream: {**kw, "stream": stream},
    )  # fmt: skip
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=3, truncation=TOP_K_4)
    out = await engine.generate([1, 2], params)
    await engine.close()
    for c in out:
        assert c.token_ids.tolist() == [7, 7, 7]
        assert c.logprobs.tolist() == pytest.approx([LOG(0.5)] * 3)
        assert c.kept.sizes().tolist() == [3, 3, 3]
        assert c.kept.ids.tolist() == [8, 9] * 3

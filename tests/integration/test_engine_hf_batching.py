"""The hf engine's batching: every request in flight shares one forward per token, and a
request's seed alone decides its completions whatever shares the batch.

One-at-a-time runs are the reference (the same seed, awaited alone); log-probs are also checked
against an independent unpadded forward of each completion (tests/tiny_models.py). The engine's
thread is paused inside a forward (`Probe`) to cancel, join or reload at a known point, never by
sleeping.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from tiny_models import full_forward_logprobs, reference_model, write_snapshot

from producer.engines.base import Completion, SamplingParams
from producer.engines.hf import HFEngine, may_join
from producer.engines.hf_batch import Batch, Request

EOS = 1
# Prompts of different lengths, each with its own n, temperature, length limit and seed.
CASES = [
    ([3, 4, 12, 5, 15], SamplingParams(n=4, temperature=1.0, max_new_tokens=12, seed=1)),
    ([7], SamplingParams(n=3, temperature=1.0, max_new_tokens=9, seed=2)),
    ([2, 9, 9, 9, 9, 9, 9, 9, 9, 30, 31], SamplingParams(n=5, temperature=1.0, max_new_tokens=12, seed=3, stop_token_ids=(20, 21))),  # noqa: E501
    ([40, 41], SamplingParams(n=2, temperature=1.0, max_new_tokens=4, seed=4)),
]  # fmt: skip


def assert_same(got: list[Completion], want: list[Completion]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.token_ids, w.token_ids)
        np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=0, atol=1e-5)
        np.testing.assert_array_equal(g.versions, w.versions)
        assert g.finish_reason == w.finish_reason


@pytest.fixture
async def engine(tiny_model_dir: Path) -> AsyncIterator[HFEngine]:
    eng = HFEngine(tiny_model_dir, device="cpu", seed=0)
    await eng.load_weights(tiny_model_dir, 0)
    yield eng
    for probe in Probe.made:  # a failed test must not leave the thread paused
        probe.resume()
    Probe.made.clear()
    await eng.close()


async def alone(engine: HFEngine, cases: list[tuple[list[int], SamplingParams]]) -> list:
    return [await engine.generate(prompt, params) for prompt, params in cases]


@pytest.mark.parametrize(
    ("device", "join_at"),
    [
        ("cpu", 1.0),
        ("cpu", 0.0),
        ("cpu", math.inf),
        pytest.param("cuda", 1.0, marks=pytest.mark.gpu),
    ],
)
async def test_batched_completions_equal_one_at_a_time_for_the_same_seeds(
    tiny_model_dir: Path, device: str, join_at: float
):
    engine = HFEngine(tiny_model_dir, device=device, seed=0, join_at=join_at)
    await engine.load_weights(tiny_model_dir, 0)
    async with asyncio.timeout(60):
        want = await alone(engine, CASES)
        forwards_before, _ = engine.forwards
        got = await asyncio.gather(*(engine.generate(p, params) for p, params in CASES))
        forwards, _ = engine.forwards
    await engine.close()
    model = reference_model(tiny_model_dir)
    for (prompt, params), g, w in zip(CASES, got, want, strict=True):
        assert_same(g, w)
        for c in g:  # left-padded rows: log-probs of an unpadded forward of the same tokens
            ref = full_forward_logprobs(model, prompt, c, params.temperature)
            assert np.abs(c.logprobs - ref).max() < 1e-4
    # One prefill for all four prompts, then one forward per token for every row of them all.
    longest = max(len(c.token_ids) for g in got for c in g)
    assert forwards - forwards_before == longest


async def test_requests_of_different_temperatures_share_a_batch(engine: HFEngine):
    cases = [
        (prompt, SamplingParams(n=3, temperature=t, max_new_tokens=8, seed=i))
        for i, (prompt, t) in enumerate([([3, 4], 0.7), ([5, 6, 7], 1.0), ([8], 1.6)])
    ]
    async with asyncio.timeout(60):
        want = await alone(engine, cases)
        got = await asyncio.gather(*(engine.generate(p, params) for p, params in cases))
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)


def make_request(prompt: list[int], params: SamplingParams) -> Request:
    stops = np.zeros(64, bool)
    stops[[EOS, *params.stop_token_ids]] = True
    assert params.seed is not None
    return Request(
        prompt_ids=prompt, n=params.n, temperature=params.temperature,
        max_new_tokens=params.max_new_tokens, seed=params.seed, is_stop_V=stops,
    )  # fmt: skip


def run_to_end(batch: Batch, steps: int = 10**6) -> list[Request]:
    """Sample and forward until the batch is empty or `steps` tokens were sampled."""
    finished = []
    for _ in range(steps):
        if batch.empty:
            break
        finished += batch.sample()
        if not batch.empty:
            batch.forward()
    return finished


def test_requests_joining_rows_in_flight_get_what_they_would_get_alone(tiny_model_dir: Path):
    model = reference_model(tiny_model_dir)
    long_prompt = [2, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 30, 31]  # longer than the cache it joins
    cases = [
        ([3, 4, 12], SamplingParams(n=4, temperature=1.0, max_new_tokens=20, seed=5)),
        (long_prompt, SamplingParams(n=3, temperature=1.0, max_new_tokens=10, seed=6)),
        ([7], SamplingParams(n=2, temperature=1.0, max_new_tokens=10, seed=7)),  # shorter
    ]
    want = []
    for prompt, params in cases:
        batch = Batch(model, torch.device("cpu"))
        batch.admit([make_request(prompt, params)], 0)
        want.append(run_to_end(batch)[0].completions())
    batch = Batch(model, torch.device("cpu"))
    requests = [make_request(p, params) for p, params in cases]
    batch.admit([requests[0]], 0)
    run_to_end(batch, steps=3)
    assert batch.mask_BS.shape[1] < len(long_prompt)
    batch.admit([requests[1]], 0)  # the rows in flight are left-padded to the new prompt
    run_to_end(batch, steps=2)
    batch.admit([requests[2]], 0)  # the new rows are left-padded to the cache
    assert len(batch.members) == 3
    run_to_end(batch)
    assert batch.empty
    assert batch.num_rows == 0
    for r, w in zip(requests, want, strict=True):
        assert_same(r.completions(), w)


class Probe:
    """Pauses the engine's thread after its `at`-th token forward; records forwards and reloads.

    `paused` is set (on the event loop) while the thread waits; `resume()` lets it go on.
    `handed_over` is set each time the engine hands queued calls to its thread.
    """

    made: ClassVar[list[Probe]] = []

    def __init__(self, engine: HFEngine, at: int) -> None:
        Probe.made.append(self)
        self.loop = asyncio.get_running_loop()
        self.paused, self.handed_over = asyncio.Event(), asyncio.Event()
        self._go = threading.Event()
        self.events: list[tuple[str, tuple[int, ...], int]] = []  # (kind, versions, rows)
        forward, load, hand_over = engine.batch.forward, engine._load, engine._hand_over
        calls = 0

        def paused_forward() -> None:
            nonlocal calls
            versions = tuple(m.version for m in engine.batch.members)
            self.events.append(("forward", versions, engine.batch.num_rows))
            forward()
            calls += 1
            if calls == at:
                self.loop.call_soon_threadsafe(self.paused.set)
                assert self._go.wait(60)

        def recorded_load(path: Path, version: int) -> None:
            self.events.append(("load", (version,), 0))
            load(path, version)

        def recorded_hand_over() -> None:
            hand_over()
            self.handed_over.set()

        engine.batch.forward = paused_forward  # type: ignore[method-assign]
        engine._load = recorded_load  # type: ignore[method-assign]
        engine._hand_over = recorded_hand_over  # type: ignore[method-assign]

    def resume(self) -> None:
        self._go.set()

    async def wait_paused(self, *requests: asyncio.Task[Any]) -> None:
        """Wait until the thread pauses; a request that ends first (the engine failed) raises.

        Without this a forward that raised before the pause (say, a library warning turned into
        an error) left the test waiting out its whole timeout with no hint of the cause.
        """
        paused = asyncio.ensure_future(self.paused.wait())
        done, _ = await asyncio.wait({paused, *requests}, return_when=asyncio.FIRST_COMPLETED)
        if paused not in done:
            paused.cancel()
            ended = done.pop()
            ended.result()  # the engine's own error
            raise AssertionError("a request finished before the engine reached the pause")


async def test_a_request_cancelled_mid_batch_leaves_it_and_the_others_are_unaffected(
    engine: HFEngine,
):
    cases = [
        ([3, 4, 12, 5], SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=8)),
        ([6, 7], SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=9)),
        ([8, 9, 10], SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=10)),
    ]
    async with asyncio.timeout(60):
        want = await alone(engine, cases)
        probe = Probe(engine, at=2)
        tasks = [asyncio.create_task(engine.generate(p, params)) for p, params in cases]
        await probe.wait_paused(*tasks)
        assert len(engine.batch.members) == 3
        tasks[1].cancel()
        await asyncio.wait([tasks[1]])  # its cancellation has reached the engine
        probe.resume()
        first, third = await tasks[0], await tasks[2]
    assert tasks[1].cancelled()
    assert_same(first, want[0])
    assert_same(third, want[2])
    _, members, _ = probe.events[2]  # the forward after the pause: without the cancelled rows
    assert len(members) <= 2
    assert engine.num_rows == 0
    assert engine.batch.empty
    assert engine.batch.cache is None
    assert_same(await engine.generate(*cases[1]), want[1])  # the engine goes on as before


@pytest.mark.parametrize("n", [5, 2])
async def test_a_request_made_mid_batch_joins_once_its_rows_match_those_in_flight(
    engine: HFEngine, n: int
):
    cases = [
        ([3, 4, 12, 5], SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=11)),
        ([6, 7, 8, 9, 10, 11, 12], SamplingParams(n=n, temperature=1.0, max_new_tokens=8, seed=12)),
    ]
    async with asyncio.timeout(60):
        want = await alone(engine, cases)
        probe = Probe(engine, at=2)
        first = asyncio.create_task(engine.generate(*cases[0]))
        await probe.wait_paused(first)
        running = engine.num_rows
        probe.handed_over.clear()
        second = asyncio.create_task(engine.generate(*cases[1]))
        await probe.handed_over.wait()
        probe.resume()
        got = [await first, await second]
    assert all(len(members) == 1 for _, members, _ in probe.events[:2])  # alone until then
    together = [rows for _, members, rows in probe.events if len(members) == 2]
    if n >= running:  # as many rows as in flight: they join at the next token
        assert len(probe.events[2][1]) == 2
    assert all(rows - n <= n for rows in together)  # never joined more rows in flight than its own
    for g, w in zip(got, want, strict=True):
        assert_same(g, w)


@pytest.mark.parametrize(
    ("running", "waiting", "mergeable", "join_at", "joins"),
    [(0, 1, False, 1.0, True), (0, 1, True, math.inf, True), (8, 8, True, 1.0, True),
     (8, 7, True, 1.0, False), (8, 1, True, 0.0, True), (8, 64, False, 1.0, False),
     (8, 64, True, math.inf, False), (8, 4, True, 0.5, True)],
)  # fmt: skip
def test_new_rows_join_an_empty_batch_or_once_they_are_join_at_times_the_rows_in_flight(
    running: int, waiting: int, mergeable: bool, join_at: float, joins: bool
):
    assert may_join(running, waiting, mergeable, join_at) is joins


async def test_a_reload_waits_for_the_rows_in_flight_and_never_overlaps_a_forward(
    engine: HFEngine, tiny_model_dir: Path, tmp_path: Path
):
    new_dir = write_snapshot(engine.model.state_dict(), tmp_path / "v1", noise=0.05, seed=1)
    old_case = ([3, 4, 12, 5], SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=13))
    new_case = ([6, 7], SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=14))
    async with asyncio.timeout(60):
        probe = Probe(engine, at=2)
        before = asyncio.create_task(engine.generate(*old_case))
        await probe.wait_paused(before)
        probe.handed_over.clear()
        reload = asyncio.create_task(engine.load_weights(new_dir, 1))
        after = asyncio.create_task(engine.generate(*new_case))
        await probe.handed_over.wait()
        assert engine.version == 0
        probe.resume()
        old_out, _, new_out = await before, await reload, await after
    kinds = [kind for kind, _, _ in probe.events]
    load_at = kinds.index("load")
    assert kinds.count("load") == 1
    assert all(versions == (0,) for _, versions, _ in probe.events[:load_at])
    assert all(versions == (1,) for _, versions, _ in probe.events[load_at + 1 :])
    assert load_at + 1 < len(kinds)  # the new request ran after the reload, on v1
    old, new = reference_model(tiny_model_dir), reference_model(tiny_model_dir, new_dir)
    for c in old_out:
        assert (c.versions == 0).all()
        assert np.abs(c.logprobs - full_forward_logprobs(old, old_case[0], c, 1.0)).max() < 1e-4
    for c in new_out:
        assert (c.versions == 1).all()
        assert np.abs(c.logprobs - full_forward_logprobs(new, new_case[0], c, 1.0)).max() < 1e-4


async def test_a_failed_forward_fails_its_requests_and_the_engine_goes_on(engine: HFEngine):
    forward = engine.batch.forward
    failures = iter([RuntimeError("out of memory (simulated)")])

    def failing_forward() -> None:
        failure = next(failures, None)
        if failure is not None:
            raise failure
        forward()

    engine.batch.forward = failing_forward  # type: ignore[method-assign]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=16, seed=15)
    async with asyncio.timeout(60):
        outcomes = await asyncio.gather(
            engine.generate([3, 4], params), engine.generate([5], params), return_exceptions=True
        )
        assert [str(o) for o in outcomes] == ["out of memory (simulated)"] * 2
        assert engine.num_rows == 0
        out = await engine.generate([3, 4], params)
    assert len(out) == 4


@pytest.fixture(scope="module")
def sliding_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Mistral with a 4-token sliding window (its cache is not plain)."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=48, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, sliding_window=4,
        max_position_embeddings=128, tie_word_embeddings=True, eos_token_id=EOS, pad_token_id=0,
        bos_token_id=None,
    )  # fmt: skip
    out = tmp_path_factory.mktemp("sliding-model")
    MistralForCausalLM(config).save_pretrained(out)
    return out


async def test_a_sliding_window_model_batches_prompts_of_any_length_exactly(sliding_model_dir):
    """Left padding keeps a window's real tokens; the cache is not merged (batch-at-a-time)."""
    cases = [
        (prompt, SamplingParams(n=3, temperature=1.0, max_new_tokens=10, seed=i))
        for i, prompt in enumerate([[3, 4], [5, 6, 7, 8, 9], [10, 11, 12, 13, 14], [7] * 7])
    ]
    engine = HFEngine(sliding_model_dir, device="cpu", seed=0)
    async with asyncio.timeout(60):
        want = await alone(engine, cases)
        sizes: list[int] = []
        forward = engine.batch.forward

        def counted_forward() -> None:
            sizes.append(len(engine.batch.members))
            forward()

        engine.batch.forward = counted_forward  # type: ignore[method-assign]
        got = await asyncio.gather(*(engine.generate(p, params) for p, params in cases))
    await engine.close()
    assert not engine.batch.mergeable
    assert sizes[0] == 4  # all four prompts, of three lengths, in one batch
    model = reference_model(sliding_model_dir)
    for (prompt, params), g, w in zip(cases, got, want, strict=True):
        assert_same(g, w)
        for c in g:  # beyond the window too: the log-probs of one unpadded forward
            ref = full_forward_logprobs(model, prompt, c, params.temperature)
            assert np.abs(c.logprobs - ref).max() < 1e-4


async def test_temperature_0_is_greedy_for_evaluation_whatever_the_seed(
    engine: HFEngine, tiny_model_dir: Path
):
    greedy = [SamplingParams(n=1, temperature=0.0, max_new_tokens=6, seed=s) for s in (1, 2)]
    sampled = SamplingParams(n=2, temperature=1.0, max_new_tokens=6, seed=3)
    async with asyncio.timeout(60):  # in one batch with a sampled request, and alone
        got = await asyncio.gather(*(engine.generate([3, 4, 5], p) for p in [*greedy, sampled]))
        alone_ = await engine.generate([3, 4, 5], greedy[0])
    first, second = got[0][0], got[1][0]
    assert first.token_ids.tolist() == second.token_ids.tolist() == alone_[0].token_ids.tolist()
    model = reference_model(tiny_model_dir)
    ids = [3, 4, 5]
    for token in first.token_ids.tolist():  # each token is the model's argmax
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
        assert token == int(logits.argmax())
        ids.append(token)
    ref = full_forward_logprobs(model, [3, 4, 5], first, 1.0)  # log-probs at T = 1
    assert np.abs(first.logprobs - ref).max() < 1e-4


PREFIX = [2, 9, 30, 31, 5, 6, 7, 8, 10, 11]  # a system turn every prompt begins with
PREFIXED = [
    ([*PREFIX, 12], SamplingParams(n=3, temperature=1.0, max_new_tokens=8, seed=21)),
    ([*PREFIX, 13, 14, 15], SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=22)),
    ([*PREFIX, 16, 17], SamplingParams(n=4, temperature=0.7, max_new_tokens=6, seed=23)),
]


async def test_prompts_with_a_common_prefix_prefill_it_once_and_sample_as_without(
    tiny_model_dir: Path, tmp_path: Path
):
    """The prefix's KV cache is made once per weights version and shared: the same tokens and
    log-probs as prefilling every whole prompt (an engine that never caches a prefix), and as an
    unpadded forward of each completion; after a reload, the new weights' prefix."""
    from producer.engines.hf_prefix import PrefixCache

    cached = HFEngine(tiny_model_dir, device="cpu", seed=0)
    whole = HFEngine(tiny_model_dir, device="cpu", seed=0)
    whole.batch.prefix = PrefixCache(min_tokens=10**9)
    new_dir = write_snapshot(cached.model.state_dict(), tmp_path / "v1", noise=0.05, seed=1)
    async with asyncio.timeout(120):
        for version, weights in ((0, tiny_model_dir), (1, new_dir)):
            for engine in (cached, whole):
                await engine.load_weights(weights, version)
            got = await asyncio.gather(*(cached.generate(p, params) for p, params in PREFIXED))
            want = await asyncio.gather(*(whole.generate(p, params) for p, params in PREFIXED))
            one = await cached.generate(*PREFIXED[1])  # a request alone after the prefix
            model = reference_model(tiny_model_dir, None if version == 0 else new_dir)
            for (prompt, params), g, w in zip(PREFIXED, got, want, strict=True):
                assert_same(g, w)
                for c in g:
                    ref = full_forward_logprobs(model, prompt, c, params.temperature)
                    assert np.abs(c.logprobs - ref).max() < 1e-4
            assert_same(one, want[1])
            assert cached.batch.prefix.ids == PREFIX
            assert cached.batch.prefix.num_computed == version + 1  # once per version
    await cached.close()
    await whole.close()

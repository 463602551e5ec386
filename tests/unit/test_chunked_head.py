"""The chunked LM head: the same log-probs, entropy and gradients as full logits, in float64, and
never a tensor the size of all positions' logits; also renormalised over kept sets (truncated
sampling), with its own gradient check."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from common.sampling.logprobs import entropy_from_logits, kept_set_logprobs, sampled_logprobs
from consumer.train.lm_head import chunk_rows_for, chunked_head, chunked_logprobs

N, H, V = 23, 6, 31


def _inputs(seed: int = 0, *, bias: bool = True, dtype: torch.dtype = torch.float64):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(N, H, generator=gen, dtype=dtype).requires_grad_(True)
    w = (torch.randn(V, H, generator=gen, dtype=dtype) * 2).requires_grad_(True)
    b = torch.randn(V, generator=gen, dtype=dtype).requires_grad_(True) if bias else None
    y = torch.randint(V, (N,), generator=gen)
    return h, w, b, y


def _reference(h, w, b, y, temperature):
    logits = h @ w.T + (0 if b is None else b)
    return sampled_logprobs(logits, y, temperature=temperature), entropy_from_logits(
        logits.detach(), temperature=temperature
    )


@pytest.mark.parametrize(
    ("temperature", "chunk_rows", "bias"),
    [(1.0, 1, True), (0.7, 4, False), (1.6, 4, True), (0.7, N, True), (1.3, 100, False)],
)
def test_log_probs_entropy_and_gradients_equal_the_full_logits_path(temperature, chunk_rows, bias):
    h, w, b, y = _inputs(bias=bias)
    logp, ent = chunked_logprobs(h, w, b, y, temperature=temperature, chunk_rows=chunk_rows)
    ref_logp, ref_ent = _reference(h, w, b, y, temperature)
    torch.testing.assert_close(logp, ref_logp, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ent, ref_ent, rtol=1e-12, atol=1e-12)
    assert not ent.requires_grad

    upstream = torch.randn(N, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    params = [t for t in (h, w, b) if t is not None]
    got = torch.autograd.grad((logp * upstream).sum(), params)
    want = torch.autograd.grad((ref_logp * upstream).sum(), params)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_gradcheck_in_float64():
    h, w, b, y = _inputs(1)
    h, w, b = h[:5].detach().requires_grad_(), w[:7].detach().requires_grad_(), b[:7]
    b = b.detach().requires_grad_()
    y = y[:5] % 7

    def fn(h, w, b):
        return chunked_logprobs(h, w, b, y, temperature=0.8, chunk_rows=2)[0]

    assert torch.autograd.gradcheck(fn, (h, w, b))


def test_only_what_needs_a_gradient_gets_one():
    h, w, _, y = _inputs(2)
    frozen = w.detach()
    logp, _ = chunked_logprobs(h, frozen, None, y, temperature=1.0, chunk_rows=5)
    logp.sum().backward()
    assert h.grad is not None
    assert frozen.grad is None


def test_a_weight_shared_with_an_embedding_gets_both_gradients():
    """Tied embeddings: the head's gradient adds to the embedding's, as with nn.Linear."""
    h, w, _, y = _inputs(3)
    ids = torch.randint(V, (N,), generator=torch.Generator().manual_seed(4))

    def hidden():
        return h + torch.nn.functional.embedding(ids, w)  # [N, H]

    logp, _ = chunked_logprobs(hidden(), w, None, y, temperature=1.0, chunk_rows=3)
    got = torch.autograd.grad(logp.sum(), w)[0]
    ref, _ = _reference(hidden(), w, None, y, 1.0)
    torch.testing.assert_close(got, torch.autograd.grad(ref.sum(), w)[0], rtol=1e-10, atol=1e-12)


def test_bfloat16_compute_matches_the_autocast_style_full_path():
    """compute_dtype=bfloat16: the matmul in bf16, everything after it in float32, as today's
    path does under bf16 autocast (`lm_head(h)` in bf16, then `.float()`)."""
    h, w, _, y = _inputs(5, bias=False, dtype=torch.float32)
    logp, ent = chunked_logprobs(
        h, w, None, y, temperature=0.9, chunk_rows=4, compute_dtype=torch.bfloat16
    )
    logits = (h.bfloat16() @ w.bfloat16().T).float()
    assert logp.dtype == torch.float32
    torch.testing.assert_close(logp, sampled_logprobs(logits, y, temperature=0.9))
    torch.testing.assert_close(ent, entropy_from_logits(logits, temperature=0.9))
    logp.sum().backward()
    assert h.grad.dtype == torch.float32
    assert w.grad.dtype == torch.float32


def test_no_positions_is_an_empty_result_and_zero_gradients():
    h, w, b, y = _inputs()
    logp, ent = chunked_logprobs(h[:0], w, b, y[:0], temperature=1.0, chunk_rows=4)
    assert logp.shape == ent.shape == (0,)
    (logp.sum() + (w * 0).sum()).backward()
    assert float(w.grad.abs().sum()) == 0.0


def test_entropy_can_be_skipped():
    h, w, b, y = _inputs()
    logp, ent = chunked_logprobs(h, w, b, y, temperature=1.0, chunk_rows=4, with_entropy=False)
    assert ent is None
    torch.testing.assert_close(logp, _reference(h, w, b, y, 1.0)[0], rtol=1e-12, atol=1e-12)


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any operation produces."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple | list) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_no_tensor_holds_more_than_one_chunk_of_logits():
    h, w, b, y = _inputs()
    chunk = 4
    with _LargestTensor() as seen:
        logp, _ = chunked_logprobs(h, w, b, y, temperature=0.7, chunk_rows=chunk)
        logp.sum().backward()
    # the weight's gradient (V x H) is the other large tensor; all N x V logits never exist
    assert seen.largest <= max(chunk * V, V * H) < N * V


@pytest.mark.parametrize(
    ("vocab", "mib", "rows"),
    [(151936, 256, 441), (18, 256, 3728270), (1000, 0.001, 1), (2**20, 4, 1)],
)
def test_chunk_rows_follow_the_memory_budget(vocab, mib, rows):
    assert chunk_rows_for(vocab, mib) == rows
    assert rows == 1 or rows * vocab * 4 <= mib * 2**20


@pytest.mark.parametrize("bad", [0, -1.0, math.nan])
def test_a_chunk_budget_must_be_positive(bad):
    with pytest.raises(ValueError, match="> 0 MiB"):
        chunk_rows_for(100, bad)


def test_bad_shapes_and_chunks_are_refused():
    h, w, b, y = _inputs()
    with pytest.raises(ValueError, match="chunk_rows"):
        chunked_logprobs(h, w, b, y, temperature=1.0, chunk_rows=0)
    with pytest.raises(ValueError, match="expected hidden"):
        chunked_logprobs(h, w, b, y[:-1], temperature=1.0, chunk_rows=2)
    with pytest.raises(ValueError, match="temperature"):
        chunked_logprobs(h, w, b, y, temperature=0.0, chunk_rows=2)


# ---------------------------------------------------------------------------------------------
# Renormalised over each position's kept set (truncated sampling)


def _kept(y: torch.Tensor, seed: int = 0, *, most: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Random kept sets in the learner's layout: the token in column 0, then 0..most-1 others,
    padded (validity False) to the widest."""
    gen = torch.Generator().manual_seed(seed)
    n = len(y)
    kept = torch.zeros(n, most, dtype=torch.long)
    valid = torch.zeros(n, most, dtype=torch.bool)
    for i in range(n):
        size = int(torch.randint(1, most + 1, (), generator=gen))
        others = [v for v in torch.randperm(V, generator=gen).tolist() if v != int(y[i])]
        kept[i, :size] = torch.tensor([int(y[i]), *others[: size - 1]])
        valid[i, :size] = True
    return kept, valid


@pytest.mark.parametrize(
    ("temperature", "chunk_rows", "bias"), [(1.0, 1, True), (0.7, 4, False), (1.6, N, True)]
)
def test_kept_set_log_probs_and_gradients_equal_the_full_logits_path(temperature, chunk_rows, bias):
    h, w, b, y = _inputs(6, bias=bias)
    kept, valid = _kept(y)
    out = chunked_head(
        h, w, b, y, temperature=temperature, chunk_rows=chunk_rows, kept=(kept, valid)
    )
    logits = h @ w.T + (0 if b is None else b)
    ref = kept_set_logprobs(logits, kept, valid, temperature=temperature)
    torch.testing.assert_close(out.logp_N, ref, rtol=1e-12, atol=1e-12)
    full = sampled_logprobs(logits, y, temperature=temperature)
    torch.testing.assert_close(out.log_kept_mass_N, (full - ref).detach(), rtol=1e-10, atol=1e-12)
    assert (out.log_kept_mass_N <= 1e-12).all()
    assert not out.log_kept_mass_N.requires_grad
    torch.testing.assert_close(
        out.entropy_N, entropy_from_logits(logits.detach(), temperature=temperature)
    )

    upstream = torch.randn(N, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    params = [t for t in (h, w, b) if t is not None]
    got = torch.autograd.grad((out.logp_N * upstream).sum(), params)
    want = torch.autograd.grad((ref * upstream).sum(), params)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_the_renormalised_head_passes_gradcheck_in_float64():
    h, w, b, y = _inputs(7)
    h, w, b = h[:5].detach().requires_grad_(), w[:7].detach().requires_grad_(), b[:7]
    b = b.detach().requires_grad_()
    y = y[:5] % 7
    gen = torch.Generator().manual_seed(3)
    kept = torch.stack([torch.cat([t[None], torch.randperm(7, generator=gen)[:3]]) for t in y])
    valid = torch.ones_like(kept, dtype=torch.bool)
    for i in range(5):  # drop repeats of the token; pad the second row
        valid[i, 1:] = kept[i, 1:] != y[i]
    valid[1, 2:] = False

    def fn(h, w, b):
        return chunked_head(h, w, b, y, temperature=0.8, chunk_rows=2, kept=(kept, valid)).logp_N

    assert torch.autograd.gradcheck(fn, (h, w, b))


def test_a_kept_set_of_the_token_alone_gives_log_prob_zero_and_no_gradient():
    h, w, b, y = _inputs(8)
    kept = y[:, None].clone()
    out = chunked_head(
        h,
        w,
        b,
        y,
        temperature=0.9,
        chunk_rows=5,
        kept=(kept, torch.ones_like(kept, dtype=torch.bool)),
    )
    assert out.logp_N.abs().max() == 0
    (g,) = torch.autograd.grad(out.logp_N.sum(), h)
    assert g.abs().max() == 0


def test_kept_sets_add_no_tensor_the_size_of_all_positions_logits():
    h, w, b, y = _inputs()
    kept, valid = _kept(y, most=6)
    chunk = 4
    with _LargestTensor() as seen:
        out = chunked_head(h, w, b, y, temperature=0.7, chunk_rows=chunk, kept=(kept, valid))
        out.logp_N.sum().backward()
    # the kept ids (at most max_kept per position) are the only new [N, ...] tensors
    assert seen.largest <= max(chunk * V, V * H, kept.numel()) < N * V


def test_kept_sets_of_another_shape_are_refused():
    h, w, b, y = _inputs()
    kept, valid = _kept(y)
    with pytest.raises(ValueError, match="kept ids"):
        chunked_head(h, w, b, y, temperature=1.0, chunk_rows=2, kept=(kept[:-1], valid[:-1]))

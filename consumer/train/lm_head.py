"""Log-probs and entropy of the sampling distribution from hidden states, LM head chunk by chunk.

Owns one computation: given the final hidden states of the positions that predict completion
tokens (`hidden_NH`, N positions, H hidden), the LM head (`weight_VH`, optional `bias_V`), the
sampled tokens and the sampling temperature T, return per position

    logp_N    = log_softmax(z / T)[token]          z = hidden @ weight.T + bias  (the logits)
    entropy_N = -Σ_v p_v log p_v,  p = softmax(z / T)   (nats; no gradient: a metric)

exactly as `common.sampling.logprobs.sampled_logprobs` and `entropy_from_logits` define them on full
logits (same operation order: the head's matmul in `compute_dtype`, then float32 at least, then
/ T), but without ever holding the logits of more than `chunk_rows` positions: memory for this
part is O(chunk_rows · V), not O(N · V). The gradient is exact, from a custom autograd function
whose backward recomputes each chunk's logits (one matmul) and uses

    ∂logp_n / ∂z_n = (onehot(token_n) - p_n) / T

so with upstream gradient g: ∂/∂hidden = G @ weight, ∂/∂weight = Gᵀ @ hidden, ∂/∂bias = Σ_n G_n
where G = g ⊙ (onehot - p) / T, chunk by chunk (∂/∂weight accumulated in float32 at least).

Truncated sampling (`kept`: each position's kept set K, common/sampling/kept_set.py, as
`common.sampling.logprobs.kept_set_logprobs` lays it out: `kept_NK` ids with the token in column 0,
`valid_NK` marking real entries): the log-prob is renormalised over K,

    logp_N = z_a - logsumexp_{k∈K} z_k          (= common.sampling.logprobs.kept_set_logprobs)
    ∂logp_n / ∂z_n = (onehot(token_n) - q_n) / T,  q = softmax over K (0 outside it)

the chunk's kept logits gathered from its logits ([C, K] more, K <= max_kept: memory bounded
by max_kept per position, never a [N, V] mask), the backward scattering -g·q into the chunk's
zeroed gradient instead of -g·p. `log_kept_mass_N` = logsumexp_K z - logsumexp z = log S (no
gradient; 0 without kept sets): how much of the policy's mass the kept sets hold. The entropy
stays that of the whole distribution, p (the policy's, a metric).

Memory: one chunk's logits in float32 (z, then log p in place), its probabilities, and the
matmul's output in `compute_dtype`; plus the weight cast to `compute_dtype` and, in backward,
the weight's gradient: about 3 x 268 MiB + 1 GiB at Qwen2.5-0.5B's head with the default
256 MiB chunks (measured on a CPU in float32 at H = 64: 776 MiB above the start, for 4096 or
16384 positions alike; full logits took 14 GiB at 4096 positions).

Does not own: which positions are completions (consumer/train/batching.py), the decoder forward
(consumer/train/forward.py), or the loss (consumer/train/loss.py). Autocast is switched off inside;
the caller states the matmul dtype (`compute_dtype`, e.g. bfloat16 where the decoder runs under
bf16 autocast), which keeps forward and backward on the same numerics.

Shapes: N positions, H hidden size, V vocabulary, C = chunk_rows.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from common.sampling.logprobs import check_temperature


def chunk_rows_for(vocab_size: int, chunk_mib: float) -> int:
    """Positions per chunk such that one chunk's float32 logits take at most `chunk_mib` MiB
    (at least 1). The part's peak is a small multiple of that: the logits, their probabilities
    and the matmul's output in `compute_dtype`."""
    if not chunk_mib > 0:
        raise ValueError(f"chunk size must be > 0 MiB, got {chunk_mib}")
    return max(1, int(chunk_mib * 2**20) // (4 * max(vocab_size, 1)))


class HeadOut(NamedTuple):
    """What the head returns per position (see the module docstring)."""

    logp_N: torch.Tensor  # log-prob of the token (over its kept set when given), with gradient
    entropy_N: torch.Tensor | None  # of the whole distribution; None unless asked for
    log_kept_mass_N: torch.Tensor  # log S, <= 0 (0 without kept sets); no gradient


def chunked_head(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    bias_V: torch.Tensor | None,
    tokens_N: torch.Tensor,
    *,
    temperature: float,
    chunk_rows: int,
    compute_dtype: torch.dtype | None = None,
    with_entropy: bool = True,
    kept: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> HeadOut:
    """Log-probs (renormalised over `kept` = (kept_NK, valid_NK) when given), entropy and the
    kept mass of the sampling distribution; see the module docstring.

    `compute_dtype` is the head matmul's dtype (default: the weight's). Results are float32, or
    float64 when the matmul runs in float64. `logp_N` carries the gradient to `hidden_NH`,
    `weight_VH` and `bias_V`; the others carry none.
    """
    check_temperature(temperature)
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
    if hidden_NH.dim() != 2 or tokens_N.shape != hidden_NH.shape[:1]:
        raise ValueError(
            f"expected hidden [N, H] and tokens [N], got {tuple(hidden_NH.shape)} and "
            f"{tuple(tokens_N.shape)}"
        )
    if kept is not None and (kept[0].shape != kept[1].shape or kept[0].shape[:1] != tokens_N.shape):
        raise ValueError(f"expected kept ids and validity [N, K], got {kept[0].shape}")
    cd = compute_dtype or weight_VH.dtype
    kept_NK, valid_NK = kept if kept is not None else (None, None)
    logp, entropy, log_mass = _ChunkedLogprobs.apply(  # type: ignore[no-untyped-call]
        hidden_NH,
        weight_VH,
        bias_V,
        tokens_N.long(),
        temperature,
        chunk_rows,
        cd,
        with_entropy,
        None if kept_NK is None else kept_NK.long(),
        valid_NK,
    )
    return HeadOut(logp, entropy if with_entropy else None, log_mass)


def chunked_logprobs(
    hidden_NH: torch.Tensor,
    weight_VH: torch.Tensor,
    bias_V: torch.Tensor | None,
    tokens_N: torch.Tensor,
    *,
    temperature: float,
    chunk_rows: int,
    compute_dtype: torch.dtype | None = None,
    with_entropy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp_N, entropy_N) over the full vocabulary: `chunked_head` without kept sets."""
    out = chunked_head(
        hidden_NH,
        weight_VH,
        bias_V,
        tokens_N,
        temperature=temperature,
        chunk_rows=chunk_rows,
        compute_dtype=compute_dtype,
        with_entropy=with_entropy,
    )
    return out.logp_N, out.entropy_N


def _logits(
    h_CH: torch.Tensor,
    w_VH: torch.Tensor,
    b_V: torch.Tensor | None,
    acc: torch.dtype,
    temperature: float,
) -> torch.Tensor:
    """z / T of one chunk, in `acc` (a fresh tensor the caller may overwrite)."""
    z = h_CH @ w_VH.T
    if b_V is not None:
        z = z + b_V
    z = z.to(acc) if z.dtype != acc else z
    if temperature != 1.0:
        z.div_(temperature)  # z is ours (the matmul's output or a copy of it): in place
    return z


def _kept_logits(z_CV: torch.Tensor, kept_CK: torch.Tensor, valid_CK: torch.Tensor) -> torch.Tensor:
    """The chunk's logits at its kept ids, -inf at padding entries: [C, K]."""
    return z_CV.gather(1, kept_CK).masked_fill_(~valid_CK, -math.inf)


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden_NH: torch.Tensor,
        weight_VH: torch.Tensor,
        bias_V: torch.Tensor | None,
        tokens_N: torch.Tensor,
        temperature: float,
        chunk_rows: int,
        cd: torch.dtype,
        with_entropy: bool,
        kept_NK: torch.Tensor | None,
        valid_NK: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        acc = torch.promote_types(cd, torch.float32)
        n = hidden_NH.shape[0]
        logp_N = hidden_NH.new_empty(n, dtype=acc)
        lse_N = hidden_NH.new_empty(n, dtype=acc)  # over the kept set when there is one
        log_mass_N = hidden_NH.new_zeros(n, dtype=acc)
        entropy_N = hidden_NH.new_zeros(n if with_entropy else 0, dtype=acc)
        with torch.autocast(hidden_NH.device.type, enabled=False):
            w = weight_VH.to(cd)
            b = None if bias_V is None else bias_V.to(cd)
            for s in range(0, n, chunk_rows):
                e = min(s + chunk_rows, n)
                z = _logits(hidden_NH[s:e].to(cd), w, b, acc, temperature)
                lse = torch.logsumexp(z, dim=-1)
                if kept_NK is None:
                    logp_N[s:e] = z.gather(1, tokens_N[s:e, None]).squeeze(1) - lse
                    lse_N[s:e] = lse
                else:
                    assert valid_NK is not None
                    zk = _kept_logits(z, kept_NK[s:e], valid_NK[s:e])
                    lse_k = torch.logsumexp(zk, dim=-1)
                    logp_N[s:e] = zk[:, 0] - lse_k  # column 0 is the token
                    lse_N[s:e] = lse_k
                    log_mass_N[s:e] = lse_k - lse
                    del zk
                if with_entropy:
                    logp_CV = z.sub_(lse[:, None])  # in place: z is ours
                    p_CV = logp_CV.exp()
                    # -Σ p·log p as a batched dot product: no third [C, V] temporary
                    entropy_N[s:e] = -(p_CV.unsqueeze(1) @ logp_CV.unsqueeze(2)).view(-1)
                    del p_CV
                del z
        ctx.save_for_backward(hidden_NH, weight_VH, bias_V, tokens_N, lse_N, kept_NK, valid_NK)
        ctx.temperature, ctx.chunk_rows, ctx.cd = temperature, chunk_rows, cd
        ctx.mark_non_differentiable(entropy_N, log_mass_N)
        return logp_N, entropy_N, log_mass_N

    @staticmethod
    def backward(
        ctx: Any,
        grad_logp_N: torch.Tensor,
        _grad_entropy: torch.Tensor | None,
        _grad_mass: torch.Tensor | None,
    ) -> tuple[torch.Tensor | None, ...]:
        hidden_NH, weight_VH, bias_V, tokens_N, lse_N, kept_NK, valid_NK = ctx.saved_tensors
        temperature, chunk_rows, cd = ctx.temperature, ctx.chunk_rows, ctx.cd
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        acc = lse_N.dtype
        n = hidden_NH.shape[0]
        grad_h = torch.empty_like(hidden_NH) if need_h else None
        grad_w = (
            torch.zeros(weight_VH.shape, dtype=acc, device=weight_VH.device) if need_w else None
        )
        grad_b = (
            torch.zeros(bias_V.shape, dtype=acc, device=bias_V.device)
            if need_b and bias_V is not None
            else None
        )
        with torch.autocast(hidden_NH.device.type, enabled=False):
            w = weight_VH.to(cd)
            b = None if bias_V is None else bias_V.to(cd)
            for s in range(0, n, chunk_rows):
                e = min(s + chunk_rows, n)
                h = hidden_NH[s:e].to(cd)
                g = grad_logp_N[s:e].to(acc)
                z = _logits(h, w, b, acc, temperature)
                if kept_NK is None:  # G = g·(onehot - p) / T, built in place in the logits
                    dz = z.sub_(lse_N[s:e, None]).exp_()
                    dz.mul_(-g[:, None]).scatter_add_(1, tokens_N[s:e, None], g[:, None])
                else:  # G = g·(onehot - q) / T: -g·q scattered at the kept ids
                    q = _kept_logits(z, kept_NK[s:e], valid_NK[s:e])
                    q = q.sub_(lse_N[s:e, None]).exp_().mul_(-g[:, None])  # 0 at padding
                    dz = z.zero_().scatter_add_(1, kept_NK[s:e], q)
                    dz.scatter_add_(1, tokens_N[s:e, None], g[:, None])
                    del q
                if temperature != 1.0:
                    dz.div_(temperature)
                if grad_b is not None:
                    grad_b += dz.sum(0)
                dz_cd = dz.to(cd) if dz.dtype != cd else dz
                del dz, z
                if grad_h is not None:
                    grad_h[s:e] = (dz_cd @ w).to(hidden_NH.dtype)
                if grad_w is not None:  # added in float32 without a float32 copy of the product
                    grad_w.add_(dz_cd.T @ h)
                del dz_cd
        return (
            grad_h,
            None if grad_w is None else grad_w.to(weight_VH.dtype),
            None if grad_b is None else grad_b.to(bias_V.dtype),
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        )

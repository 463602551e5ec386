"""common/sampling/logprobs.py: the sampling log-prob rule, its entropy and the temperature check.

Float64 on CPU where the dtype is not the point of the test.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from common.sampling.logprobs import entropy_from_logits, sampled_logprobs


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3, 2.0])
def test_sampled_logprobs_are_log_softmax_of_tempered_logits(temperature):
    rng = np.random.default_rng(10)
    logits = torch.from_numpy(rng.normal(0, 3, (2, 3, 11))).requires_grad_(True)
    tokens = torch.from_numpy(rng.integers(0, 11, (2, 3))).to(torch.int32)
    got = sampled_logprobs(logits, tokens, temperature=temperature)
    expected = torch.log_softmax(logits / temperature, -1).gather(-1, tokens.long()[..., None])
    torch.testing.assert_close(got, expected[..., 0], rtol=1e-12, atol=1e-12)
    (g1,) = torch.autograd.grad(got.sum(), logits)
    (g2,) = torch.autograd.grad(expected.sum(), logits)
    torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    ("dtype", "computed"),
    [
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_sampled_logprobs_compute_in_float32_at_least_and_keep_float64(dtype, computed):
    logits = torch.zeros(1, 1, 4, dtype=dtype)
    got = sampled_logprobs(logits, torch.zeros(1, 1, dtype=torch.long), temperature=0.5)
    assert got.dtype == computed
    assert got.item() == pytest.approx(-math.log(4.0))


def test_sampled_logprobs_ignore_minus_infinity_logits_of_other_tokens():
    logits = torch.tensor([[[0.0, 0.0, -math.inf]]])
    got = sampled_logprobs(logits, torch.tensor([[1]]), temperature=0.8)
    assert got.item() == pytest.approx(-math.log(2.0))


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.nan, math.inf])
def test_temperature_must_be_positive_and_finite(temperature):
    with pytest.raises(ValueError, match="temperature"):
        sampled_logprobs(
            torch.zeros(1, 1, 3), torch.zeros(1, 1, dtype=torch.long), temperature=temperature
        )
    with pytest.raises(ValueError, match="temperature"):
        entropy_from_logits(torch.zeros(1, 1, 3), temperature=temperature)


def test_entropy_of_the_sampling_distribution():
    logits = torch.tensor(
        [
            [
                [0.0] * 5,
                [0.0, 0.0, -math.inf, -math.inf, -math.inf],
                [0.0, -math.inf, -math.inf, -math.inf, -math.inf],
                [1.0, 2.0, 3.0, 0.0, 0.0],
            ]
        ],
        dtype=torch.float64,
    )
    ent = entropy_from_logits(logits, temperature=0.5)
    p = torch.softmax(logits[0, 3] / 0.5, -1)
    expected = [math.log(5.0), math.log(2.0), 0.0, -(p * p.log()).sum().item()]
    assert ent[0].tolist() == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_entropy_is_computed_in_float32_at_least(dtype):
    logits = torch.tensor([[[0.0, 1.0, 2.0, 3.0]]])
    got = entropy_from_logits(logits.to(dtype), temperature=0.7)
    assert got.dtype == torch.float32
    exact = entropy_from_logits(logits.to(dtype).double(), temperature=0.7)
    assert got.item() == pytest.approx(exact.item(), rel=1e-6)  # no half-precision rounding

"""consumer/train/attention.py: which attention path, and layout, each request gets on each
device."""

from __future__ import annotations

import pytest
import torch

from consumer.train import attention as A

FA2 = "flash_attention_2"


@pytest.mark.parametrize(
    ("requested", "device", "half", "flash", "flex", "path", "impl"),
    [
        ("auto", "cuda", True, FA2, True, "flash", FA2),
        ("auto", "cuda", True, "flash_attention_3", True, "flash", "flash_attention_3"),
        ("auto", "cuda", False, FA2, True, "flex", A.FLEX_IMPL),  # flash needs bf16
        ("auto", "cuda", True, None, True, "flex", A.FLEX_IMPL),
        ("auto", "cuda", True, None, False, "padded", "sdpa"),
        ("auto", "cpu", False, FA2, True, "shared_prompt", "sdpa"),  # no flex backward on a CPU
        ("shared_prompt", "cuda", True, FA2, True, "shared_prompt", "sdpa"),
        ("padded", "cuda", True, FA2, True, "padded", "sdpa"),
        ("flex", "cuda", True, FA2, True, "flex", A.FLEX_IMPL),
        ("sdpa_packed", "cpu", False, None, False, "sdpa_packed", "sdpa"),
        ("flash", "cuda", True, FA2, False, "flash", FA2),
    ],
)
def test_each_request_gets_its_path(requested, device, half, flash, flex, path, impl):
    got = A.choose_attention(
        requested, device_type=device, half_precision=half, flash_impl=flash, flex_ok=flex
    )
    assert (got.path, got.hf_impl) == (path, impl)
    assert got.packed == (path in ("flash", "flex", "sdpa_packed"))
    assert got.shared_prompt == (path == "shared_prompt")
    assert got.path in got.describe()


def test_a_sliding_window_keeps_a_cpu_on_padded_rows_and_refuses_a_shared_prompt():
    """The shared-prompt mask is full attention: a model with a sliding window cannot use it."""
    kw = dict(device_type="cpu", half_precision=False, flash_impl=None, flex_ok=True)
    got = A.choose_attention("auto", full_attention=False, **kw)
    assert got.path == "padded"
    assert "sliding window" in got.reason
    with pytest.raises(ValueError, match=r"model.attention = shared_prompt: .*sliding window"):
        A.choose_attention("shared_prompt", full_attention=False, **kw)


@pytest.mark.parametrize(
    ("requested", "device", "half", "flash", "flex", "reason"),
    [
        ("flash", "cuda", True, None, True, "flash-attn is not installed"),
        ("flash", "cpu", False, FA2, True, "needs CUDA"),
        ("flash", "cuda", False, FA2, True, "needs half precision"),
        ("flex", "cpu", False, None, True, "no backward on a CPU"),
        ("flex", "cuda", True, None, False, "no flex_attention"),
    ],
)
def test_an_explicit_request_that_cannot_run_is_refused_with_the_reason(
    requested, device, half, flash, flex, reason
):
    with pytest.raises(ValueError, match=f"model.attention = {requested}: .*{reason}"):
        A.choose_attention(
            requested, device_type=device, half_precision=half, flash_impl=flash, flex_ok=flex
        )


def test_auto_says_why_it_fell_back():
    got = A.choose_attention(
        "auto", device_type="cpu", half_precision=False, flash_impl=None, flex_ok=True
    )
    assert got.path == "shared_prompt"
    assert "flash-attn is not installed" in got.reason
    assert "no backward on a CPU" in got.reason


def test_only_varlen_flash_gets_the_row_boundaries():
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    flash = A.Attention("flash", FA2, True, "")
    assert A.forward_kwargs(flash, cu, 4) == {
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": 4,
        "max_length_k": 4,
    }
    assert A.forward_kwargs(flash, None, 4) == {}
    assert A.forward_kwargs(A.Attention("flex", A.FLEX_IMPL, True, ""), cu, 4) == {}


def test_the_flex_shim_casts_to_the_autocast_dtype(monkeypatch):
    """RoPE leaves q and k in float32 under autocast while v is bf16: the shim hands flex one
    dtype. (The real flex kernel runs on a GPU; here the transformers function is replaced.)"""
    from transformers import AttentionInterface
    from transformers.integrations import flex_attention as hf_flex

    seen = []
    monkeypatch.setattr(
        hf_flex, "flex_attention_forward", lambda m, q, k, v, mask, **kw: seen.append(
            (q.dtype, k.dtype, v.dtype)
        )
    )  # fmt: skip
    A._register_flex()
    shim = AttentionInterface()[A.FLEX_IMPL]
    q = torch.zeros(1, 1, 2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        shim(None, q, q, q.bfloat16(), None)
    shim(None, q, q, q, None)
    assert seen == [(torch.bfloat16,) * 3, (torch.float32,) * 3]

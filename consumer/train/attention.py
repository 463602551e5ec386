"""Which attention the learner's forward uses, and therefore how a micro-batch's rows are laid out.

Paths (`model.attention`; layouts in consumer/train/batching.py):
- `flash`: rows packed into one sequence without padding; flash-attn's varlen kernel with the
  rows' `cu_seqlens` (transformers' `flash_attention_3` / `flash_attention_2`). Needs the
  flash-attn package (`flash_attn_interface` for FA3, `flash_attn` for FA2), CUDA and half
  precision (`model.dtype = "bfloat16"`).
- `flex`: rows packed; torch `flex_attention` (compiled by transformers) with a document mask
  built from the restarting position ids. Needs CUDA: flex_attention has no backward on a CPU.
  Query, key and value are cast to the autocast dtype first (RoPE leaves q and k in float32
  under autocast; older torch refuses mixed dtypes in flex_attention).
- `sdpa_packed`: rows packed; SDPA with a dense block-diagonal [S, S] mask. Exact anywhere, but
  the mask and the math kernel are O(S²): for small micro-batches and for testing the packed
  layout on a CPU. Never chosen by `auto`.
- `padded`: rows right-padded, SDPA, as before packing existed; a micro-batch whose rows all have
  the same length gets no mask at all (causal only), which keeps SDPA on its flash kernel.
- `shared_prompt`: each group's prompt once, its G completions after it, SDPA with a dense
  per-group mask (consumer/train/shared_prompt.py); a micro-batch where that saves too little
  (long completions, G = 1) is laid out `padded`. Needs full attention in every layer.

`auto` picks `flash` if installed (CUDA, bf16), else `flex` (CUDA), else `padded` on CUDA and
`shared_prompt` on a CPU (where the decoder's matrix products are most of a step: measured on
docs/real_model's task, 80% of a step in `mm`, and the shared layout runs 2.8x fewer positions).
On a CPU the padded rows and the shared prompt are the paths with a backward that does not cost
O(S²) in the batch. The choice is made once per run, logged once, and every step's metrics say
which layout its micro-batches took (`attention`).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

import torch

from common.config import LearnerAttention

FLEX_IMPL = "asyncgrpo_flex"  # transformers' flex attention behind an autocast cast (below)


@dataclass(frozen=True, slots=True)
class Attention:
    path: str  # flash | flex | sdpa_packed | padded
    hf_impl: str  # the transformers attn_implementation that runs it
    packed: bool  # rows concatenated without padding
    reason: str  # why this path, for the log
    shared_prompt: bool = False  # a group's prompt once (where it saves enough), else padded

    def describe(self) -> str:
        layout = (
            "a group's prompt once, else rows padded"
            if self.shared_prompt
            else "rows packed without padding"
            if self.packed
            else "rows padded"
        )
        return f"{self.path} ({layout}, transformers {self.hf_impl}): {self.reason}"


def choose_attention(
    requested: LearnerAttention,
    *,
    device_type: str,
    half_precision: bool,
    flash_impl: str | None,
    flex_ok: bool,
    full_attention: bool = True,
) -> Attention:
    """The attention path for `requested` on this device (pure: availability is passed in).

    `flash_impl` is the installed flash-attn's transformers name (None = not installed),
    `flex_ok` whether torch has flex_attention, `full_attention` whether every layer of the
    model attends to all earlier positions (no sliding window). An explicit request that cannot
    run here is a `ValueError` naming the reason; `auto` falls back instead.
    """
    cuda = device_type == "cuda"
    flash_why = (
        "flash-attn is not installed"
        if flash_impl is None
        else "flash-attn needs CUDA"
        if not cuda
        else "flash-attn needs half precision (model.dtype = bfloat16)"
        if not half_precision
        else None
    )
    flex_why = (
        "this torch has no flex_attention"
        if not flex_ok
        else "flex_attention has no backward on a CPU"
        if not cuda
        else None
    )
    if requested == "flash" or (requested == "auto" and flash_why is None):
        if flash_why is not None:
            raise ValueError(f"model.attention = flash: {flash_why}")
        assert flash_impl is not None
        return Attention("flash", flash_impl, True, "varlen kernel, no padding computed")
    if requested == "flex" or (requested == "auto" and flex_why is None):
        if flex_why is not None:
            raise ValueError(f"model.attention = flex: {flex_why}")
        why = "requested" if requested == "flex" else f"{flash_why}; document mask, no padding"
        return Attention("flex", FLEX_IMPL, True, why)
    if requested == "sdpa_packed":
        return Attention("sdpa_packed", "sdpa", True, "requested; dense block mask, O(S^2)")
    shared_why = "a layer attends through a sliding window" if not full_attention else None
    if requested == "shared_prompt" or (requested == "auto" and not cuda and shared_why is None):
        if shared_why is not None:
            raise ValueError(f"model.attention = shared_prompt: {shared_why}")
        fell = "; ".join(w for w in (flash_why, flex_why) if w)
        why = "requested" if requested == "shared_prompt" else f"{fell}; a group's prompt once"
        return Attention("shared_prompt", "sdpa", False, why, shared_prompt=True)
    reasons = (flash_why, flex_why) + ((shared_why,) if not cuda else ())
    why = "requested" if requested == "padded" else "; ".join(w for w in reasons if w)
    return Attention("padded", "sdpa", False, why)


def installed_flash() -> str | None:
    """transformers' name for the installed flash-attn (3 before 2), or None."""
    if importlib.util.find_spec("flash_attn_interface") is not None:
        return "flash_attention_3"
    if importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return None


def flex_available() -> bool:
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def use(model: Any, attention: Attention) -> None:
    """Switch a transformers model to the path's attention implementation."""
    if attention.hf_impl == FLEX_IMPL:
        _register_flex()
    model.set_attn_implementation(attention.hf_impl)


def forward_kwargs(
    attention: Attention, cu_seqlens: torch.Tensor | None, max_seqlen: int
) -> dict[str, Any]:
    """Extra keyword arguments of the decoder forward: the row boundaries for varlen flash
    attention (so transformers need not derive them from position ids with a device sync)."""
    if attention.path != "flash" or cu_seqlens is None:
        return {}
    return {
        "cu_seq_lens_q": cu_seqlens,
        "cu_seq_lens_k": cu_seqlens,
        "max_length_q": max_seqlen,
        "max_length_k": max_seqlen,
    }


def _register_flex() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flex_attention_mask

    AttentionInterface.register(FLEX_IMPL, _flex_autocast)
    AttentionMaskInterface.register(FLEX_IMPL, flex_attention_mask)


def _flex_autocast(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    **kwargs: Any,
) -> Any:
    """transformers' flex attention with query, key and value in the autocast dtype."""
    from transformers.integrations import flex_attention as hf_flex

    kind = query.device.type
    if torch.is_autocast_enabled(kind):
        dtype = torch.get_autocast_dtype(kind)
        query, key, value = query.to(dtype), key.to(dtype), value.to(dtype)
    return hf_flex.flex_attention_forward(module, query, key, value, attention_mask, **kwargs)

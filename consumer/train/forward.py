"""The learner's forward: the decoder, then the LM head at completion positions only, one module.

`CompletionForward(model)(micro_batch)` runs a transformers causal LM's decoder on the
micro-batch's inputs (padded or packed, consumer/train/batching.py), picks the hidden states of the
N positions that predict completion tokens, and returns their log-probs under the sampling
distribution (renormalised over each token's kept set when the micro-batch carries kept sets:
truncated sampling), the entropy and the kept mass there (consumer/train/lm_head.py `HeadOut`):
full-vocabulary logits are never formed for prompt positions, padding, or more than one chunk of
positions at a time.

One module call does both, so that a sharded learner can wrap this module as its root: FSDP2
unshards the root's own parameters (embeddings, final norm, LM head) in the root's pre-forward
hook, i.e. only when this module's forward runs (`fully_shard` each decoder layer, then
`fully_shard(CompletionForward(model))`). The wrapped model keeps its own parameter names; the
trainer publishes `model.state_dict()`, never this wrapper's.

`check_plain_head(model)` guards the one assumption: that the model's logits are exactly
`lm_head(last_hidden_state)` (no soft-capping or logit scaling), checked on a few tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from consumer.train import attention as A
from consumer.train.batching import MicroBatch
from consumer.train.lm_head import HeadOut, chunk_rows_for, chunked_head


class CompletionForward(torch.nn.Module):
    """decoder + chunked LM head; forward(mb) -> HeadOut (logp_N, entropy_N or None, kept
    mass)."""

    def __init__(
        self,
        model: Any,
        attention: A.Attention,
        *,
        temperature: float,
        chunk_mib: float,
    ) -> None:
        super().__init__()
        self.model = model
        self.attention = attention
        self.temperature = temperature
        self.chunk_rows = chunk_rows_for(model.get_output_embeddings().out_features, chunk_mib)

    def forward(self, mb: MicroBatch, *, with_entropy: bool = True) -> HeadOut:
        hidden = self.model.get_decoder()(
            input_ids=mb.input_ids_BL,
            attention_mask=mb.attention_mask_BL,
            position_ids=mb.position_ids_BL,
            use_cache=False,
            **A.forward_kwargs(self.attention, mb.cu_seqlens, mb.max_seqlen),
        ).last_hidden_state
        hidden_NH = hidden.reshape(-1, hidden.shape[-1]).index_select(0, mb.hidden_index_N)
        head = self.model.get_output_embeddings()
        kind = hidden_NH.device.type
        autocast = torch.is_autocast_enabled(kind)
        return chunked_head(
            hidden_NH,
            head.weight,
            head.bias,
            mb.tokens_N,
            temperature=self.temperature,
            chunk_rows=self.chunk_rows,
            compute_dtype=torch.get_autocast_dtype(kind) if autocast else head.weight.dtype,
            with_entropy=with_entropy,
            kept=mb.kept,
        )


def compile_layers(model: Any, *, backend: str = "inductor") -> None:
    """torch.compile each decoder layer in place (`nn.Module.compile`: parameter names and the
    module tree stay as they are, so snapshots, checkpoints and per-layer sharding still see the
    transformers model). Compiling per layer, not the whole model, keeps one graph for all
    layers and leaves mask construction and the chunked head in eager mode."""
    layers = getattr(model.get_decoder(), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"model.compile: {type(model).__name__} has no decoder layer list")
    for layer in layers:
        layer.compile(backend=backend)


@torch.no_grad()
def check_plain_head(model: Any, *, num_tokens: int = 8) -> None:
    """`ValueError` unless the model's logits are its LM head applied to its last hidden state."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ValueError(f"the learner needs a linear LM head, this model has {type(head)}")
    ids = torch.arange(num_tokens, device=head.weight.device)[None] % head.out_features
    training = model.training
    model.eval()  # no dropout: both forwards must see the same network
    try:
        logits = model(input_ids=ids, use_cache=False).logits.float()
        hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
        plain = head(hidden).float()
    finally:
        model.train(training)
    if not torch.allclose(logits, plain, rtol=1e-4, atol=1e-4):
        raise ValueError(
            f"{type(model).__name__} post-processes its logits (soft-capping or scaling?): the "
            "learner computes log-probs from lm_head(hidden states) chunk by chunk and would "
            "not match what the model samples from; this model is not supported"
        )

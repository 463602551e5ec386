"""The learner's LoRA adapter: put on a loaded model, its tensors by file name, restored.

`attach(model, lora, model_dir)` checks `[model.lora]` against the model (every target module
name must name at least one `nn.Linear` of the decoder; the LM head and embeddings are never
adapted: the chunked LM head reads `lm_head.weight` directly), injects peft's LoRA layers in
place (`peft.inject_adapter_in_model`: the model keeps its class and module tree, so the
learner's forward, attention choice, chunked head, gradient checkpointing and FSDP2's per-layer
sharding see the same transformers model), freezes every base weight and returns the
`AdapterHeader` its snapshots carry (common/weights/adapter.py: spec and base hash). peft
initialises A (Kaiming-uniform, from torch's seeded generator) and B = 0, so version 0 is the
base model exactly.

`tensors(model)` are the adapter's live tensors under their file names (peft's saved names,
`base_model.model.<module>.lora_A.weight`): what the trainer publishes and checkpoints.
`restore(model, tensors)` copies a file's tensors back (`--resume`), refusing any other set.
`disabled(model)`: inside, every adapted layer is its base layer alone (peft's adapter switch),
so the model is the base exactly: the reference policy of a LoRA run (`loss.beta > 0`) with no
second copy of the base in memory.

The optimizer holds the adapter's parameters only (`trainable`): no moments for the frozen
base, which is where the memory goes (AdamW keeps two fp32 moments per trained weight).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from common.config.run import LoraConfig
from common.errors import ConfigError, SnapshotError
from common.weights import adapter as fmt


def linear_names(model: Any) -> set[str]:
    """The last name part of every `nn.Linear` inside the decoder (what targets may name)."""
    decoder = model.get_decoder()
    return {n.rpartition(".")[2] for n, m in decoder.named_modules() if _is_linear(m)}


def _is_linear(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.Linear)


def check_targets(lora: LoraConfig, available: set[str]) -> None:
    """`ConfigError` (one line) for a target module name no linear layer of the model has."""
    missing = [t for t in lora.target_modules if t not in available]
    if missing:
        raise ConfigError(
            f"model.lora.target_modules: no linear module named {', '.join(map(repr, missing))} "
            f"in this model's decoder (it has: {', '.join(sorted(available))})"
        )


def check_model(lora: LoraConfig, model_dir: Path) -> None:
    """Before anything starts: peft is installed and every target names a linear module of the
    model in `model_dir` (built on the meta device: no weight is read). `ConfigError` if not."""
    from transformers import AutoConfig, AutoModelForCausalLM

    _peft()
    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)  # type: ignore[no-untyped-call]
    check_targets(lora, linear_names(model))


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise ConfigError(
            "model.lora.enabled needs peft: pip install -c .ci/lock.txt -e '.[lora]'"
        ) from None
    return peft


def attach(model: Any, lora: LoraConfig, model_dir: Path) -> fmt.AdapterHeader:
    """Put a LoRA adapter on `model` in place and freeze the rest; the adapter's header."""
    peft = _peft()
    check_targets(lora, linear_names(model))
    decoder_prefix = _decoder_prefix(model)
    # peft matches a name's last part anywhere; anchored to the decoder, never the LM head
    pattern = rf"^{decoder_prefix}.*\.({'|'.join(map(_escape, lora.target_modules))})$"
    config = peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=pattern,
        bias="none",
    )
    model.requires_grad_(False)
    peft.inject_adapter_in_model(config, model)
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_A." in name or ".lora_B." in name)
    spec = fmt.AdapterSpec(
        rank=lora.rank,
        alpha=lora.alpha,
        target_modules=list(lora.target_modules),
        dropout=lora.dropout,
    )
    return fmt.AdapterHeader(spec, fmt.base_hash(model_dir))


def _decoder_prefix(model: Any) -> str:
    decoder = model.get_decoder()
    for name, module in model.named_modules():
        if module is decoder:
            return str(name).replace(".", r"\.")
    raise ConfigError("model.lora: cannot find the model's decoder")  # pragma: no cover


def _escape(name: str) -> str:
    import re

    return re.escape(name)


def adapted_modules(model: Any) -> dict[str, Any]:
    """Module name -> peft LoRA layer, in module order."""
    from peft.tuners.lora import LoraLayer

    return {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def tensors(model: Any) -> dict[str, torch.Tensor]:
    """The adapter's live tensors (detached views) by file name (peft's saved names), A before
    B per module."""
    out: dict[str, torch.Tensor] = {}
    for name, module in adapted_modules(model).items():
        a_name, b_name = fmt.tensor_names(name)
        out[a_name] = module.lora_A["default"].weight.detach()
        out[b_name] = module.lora_B["default"].weight.detach()
    return out


@contextmanager
def disabled(model: Any) -> Iterator[None]:
    """Inside: the model without its adapter (the base's outputs exactly); the adapter, its
    trainability included, as before on the way out."""
    layers = list(adapted_modules(model).values())
    trained = trainable(model)
    for layer in layers:
        layer.enable_adapters(False)  # peft also clears requires_grad: restored below
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)
        for param in model.parameters():
            param.requires_grad_(False)
        for param in trained:
            param.requires_grad_(True)


def trainable(model: Any) -> list[torch.nn.Parameter]:
    """The parameters the optimizer holds: the adapter's."""
    return [p for p in model.parameters() if p.requires_grad]


@torch.no_grad()
def restore(model: Any, saved: Mapping[str, torch.Tensor]) -> None:
    """Copy an adapter file's tensors into the model's adapter; `SnapshotError` unless the
    names and shapes are exactly the model's adapter's."""
    live = tensors(model)
    if set(saved) != set(live):
        odd = sorted(set(saved) ^ set(live))
        raise SnapshotError(f"the adapter's tensors differ from this model's: {odd[:3]}")
    for name, tensor in live.items():
        if tuple(saved[name].shape) != tuple(tensor.shape):
            raise SnapshotError(f"adapter tensor {name}: shape {list(saved[name].shape)}")
        tensor.copy_(saved[name].to(tensor.dtype))

"""The hf engine's LoRA adapters: each version's adapter merged into its own copy of the base.

A LoRA snapshot (common/weights/adapter.py) holds, for each adapted linear module, A (`rank x in`)
and B (`out x rank`); the policy's weight is `W = W_base + (alpha / rank) B A`. `Adapters.load(f,
header, path)` checks the adapter's base hash against this engine's model directory
(`AdapterBaseMismatch`: refused, nothing changed), checks every name and shape, then writes `W_base
+ scaling * B @ A` (common/weights/adapter_merge.py: float32 arithmetic, cast to the model's dtype)
into each adapted module's weight. The engine's model stays a plain transformers model: sampling
costs what it costs without LoRA. `W_base` of each adapted module is kept aside the first time (the
only extra memory: the adapted modules' base weights, once), so every version is applied to the
base, never on top of the previous version.

Why merged (measured with bench/lora.py, `engine_*` keys: docs/lora.md): the alternative, peft's
LoRA layers in the engine's model with each version's A and B copied in, adds two small matrix
products per adapted module to every token step; merging costs one `B @ A` per module per version
(milliseconds) and nothing per token. Both give the learner's log-probs to float32 rounding.

A whole-model snapshot loaded after adapters (`forget`) overwrites every weight, merged or not: the
kept base weights no longer describe the model and are dropped, and the next adapter restores the
base from the model directory first (`restore_base`), so an engine kept between runs
(`producer.follow`) never applies an adapter on top of another run's weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from common.weights import adapter as fmt
from common.weights import adapter_merge as merge


class Adapters:
    """The adapter state of one hf engine's model (used on its torch thread only)."""

    def __init__(self, model: Any, model_dir: Path) -> None:
        self.model = model
        self.model_dir = Path(model_dir)
        self._base_hash = ""
        self._base: dict[str, torch.Tensor] = {}  # module name -> its base weight (a copy)
        self._dirty = False  # a whole snapshot was loaded: the weights are not the base
        self.applied: fmt.AdapterHeader | None = None

    def base_hash(self) -> str:
        """This engine's base: the hash of its model directory's weight files (once)."""
        if not self._base_hash:
            self._base_hash = fmt.base_hash(self.model_dir)
        return self._base_hash

    @torch.no_grad()
    def load(self, f: Any, header: fmt.AdapterHeader, path: Path) -> None:
        """Apply the adapter in the open safetensors file `f` (see the module doc)."""
        fmt.check_base(header, self.base_hash(), path)
        pairs = merge.pairs(self.model, f, header, path)  # every check before any change
        if self._dirty:
            self.restore_base()
        linears = dict(self.model.named_modules())
        for name in [n for n in self._base if n not in pairs]:  # adapted before, not now
            linears[name].weight.copy_(self._base.pop(name))
        for name, (module, a, b) in pairs.items():
            base = self._base.setdefault(name, module.weight.detach().clone())
            module.weight.copy_(merge.merged(base, a, b, header.spec.scaling))
        self.applied = header

    def forget(self) -> None:
        """A whole snapshot was loaded over every weight: no base kept applies any more."""
        self._base.clear()
        self.applied = None
        self._dirty = True

    @torch.no_grad()
    def restore_base(self) -> None:
        """Load the base weights from the model directory again (after a whole snapshot)."""
        from safetensors import safe_open

        own = self.model.state_dict()
        for file in sorted(self.model_dir.glob("*.safetensors")):
            with safe_open(str(file), framework="pt", device="cpu") as f:
                for key in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                    if key in own:
                        own[key].copy_(f.get_tensor(key).to(own[key].dtype))
        self._dirty = False

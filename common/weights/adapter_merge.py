"""A LoRA adapter's matrices merged into a model's linear weights: `W = W_base + (alpha/r) B A`.

One rule for everyone who applies an adapter to a model in memory: the hf engine (each version,
producer/engines/hf_adapter.py), evaluation (`asyncgrpo eval` of a LoRA run's snapshot) and
`asyncgrpo export` (a merged model directory). `pairs` checks an adapter file against a model
(every adapted module is an `nn.Linear` of it, A is `rank x in` and B `out x rank`) before
anything is changed; `merged` computes one weight in float32 and casts it to the weight's
dtype; `merge_file` does both for a model that holds the base weights.

The format (names, header, base hash) is common/weights/adapter.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from common.errors import SnapshotError
from common.weights import adapter as fmt

Pair = tuple[torch.nn.Linear, torch.Tensor, torch.Tensor]  # (module, A, B)


def pairs(model: Any, f: Any, header: fmt.AdapterHeader, where: Path | str) -> dict[str, Pair]:
    """Module name -> (module, A, B) of the adapter in the open safetensors file `f`, checked
    against `model`; `SnapshotError` (nothing changed) if any does not fit."""
    linears = dict(model.named_modules())
    out: dict[str, Pair] = {}
    r = header.spec.rank
    for name in fmt.modules(f.keys()):
        module = linears.get(name)
        if not isinstance(module, torch.nn.Linear):
            raise fmt.AdapterBaseMismatch(f"adapter {where}: the model has no linear {name}")
        a_name, b_name = fmt.tensor_names(name)
        a, b = f.get_tensor(a_name), f.get_tensor(b_name)
        out_f, in_f = module.weight.shape
        if tuple(a.shape) != (r, in_f) or tuple(b.shape) != (out_f, r):
            raise SnapshotError(
                f"adapter {where}: {name} has A {list(a.shape)} and B {list(b.shape)}, "
                f"not [{r}, {in_f}] and [{out_f}, {r}]"
            )
        out[name] = (module, a, b)
    return out


@torch.no_grad()
def merged(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """`base + scaling * b @ a`, computed in float32, in `base`'s dtype and device."""
    delta = b.to(base.device, torch.float32) @ a.to(base.device, torch.float32)
    return (base.float() + delta.mul_(scaling)).to(base.dtype)


@torch.no_grad()
def merge_file(model: Any, path: Path, base_dir: Path) -> fmt.AdapterHeader | None:
    """Merge the adapter file `path` into `model` (which holds the base weights of `base_dir`)
    in place; None, untouched, when `path` is a whole model's snapshot. `AdapterBaseMismatch`
    for an adapter of another base."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            header = fmt.from_metadata(f.metadata())
            if header is None:
                return None
            fmt.check_base(header, fmt.base_hash(base_dir), path)
            for module, a, b in pairs(model, f, header, path).values():
                module.weight.copy_(merged(module.weight, a, b, header.spec.scaling))
    except (OSError, SafetensorError) as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {exc}") from None
    return header

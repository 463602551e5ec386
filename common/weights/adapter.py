"""A LoRA adapter as a snapshot: what the file says about itself, and the base it applies to.

With `model.lora.enabled` a published version is the adapter, not the model: the snapshot's
`model.safetensors` holds only the LoRA matrices, in peft's saved names
(`base_model.model.<module>.lora_A.weight`, `... .lora_B.weight`: A is `rank x in`, B is
`out x rank`), and its safetensors header says what they are (`__metadata__`, strings):

    "format": "pt", "asyncgrpo.adapter": "lora", "asyncgrpo.base_hash": "<hex>",
    "asyncgrpo.lora": '{"rank": r, "alpha": a, "dropout": p, "target_modules": [...]}'

so the one file that publication, network fetch, relays and verification already move and hash
carries everything a producer needs: nothing else travels, and a relayed or fetched adapter is
verified like any snapshot. The snapshot directory adds peft's `adapter_config.json`
(`peft_config`) so that `PeftModel.from_pretrained(base, snapshot_dir)` reads it as it is
(through a link `adapter_model.safetensors`, peft's file name, to the same inode).

The base hash names the weights an adapter was trained on: BLAKE3 over the base model
directory's weight files (`base_hash`: each file's name and hash, in name order). A producer
computes it over its own model directory and refuses an adapter whose hash differs (the
engine's load raises `AdapterBaseMismatch`: one line, counted; nothing loaded).

Deltas are not made for adapters: an adapter is about 1-4% of the model's bytes, every element
of it changes at every step (a sparse delta would be no smaller), and it is already smaller
than one chunk of a full snapshot's delta on most models.

What it owns: the format (names, metadata, the base hash). No torch here: applying an adapter
is producer/engines/hf_adapter.py (the hf engine) and launch/export.py (a merged model).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import blake3
from safetensors import SafetensorError, safe_open

from common.errors import SnapshotError, SnapshotMismatch

KIND_KEY = "asyncgrpo.adapter"
BASE_KEY = "asyncgrpo.base_hash"
SPEC_KEY = "asyncgrpo.lora"
PEFT_CONFIG_FILE = "adapter_config.json"
PEFT_WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
_hash_cache: dict[tuple[str, int, int], str] = {}


class AdapterBaseMismatch(SnapshotMismatch):
    """An adapter trained on another base model than the one this process holds."""


@dataclass(frozen=True, slots=True)
class AdapterSpec:
    """What an adapter is: its rank, scale and the modules it adapts (the learner's
    `[model.lora]`, as the file records it)."""

    rank: int
    alpha: float
    target_modules: list[str] = field(default_factory=list)
    dropout: float = 0.0

    @property
    def scaling(self) -> float:
        """The factor of the update `B @ A` (peft's `lora_alpha / r`)."""
        return self.alpha / self.rank


@dataclass(frozen=True, slots=True)
class AdapterHeader:
    """An adapter file's own account of itself: its spec and the base it applies to."""

    spec: AdapterSpec
    base_hash: str


def metadata(spec: AdapterSpec, base: str) -> dict[str, str]:
    """The safetensors `__metadata__` of an adapter file (see the module doc)."""
    return {
        "format": "pt",
        KIND_KEY: "lora",
        BASE_KEY: base,
        SPEC_KEY: json.dumps(asdict(spec), sort_keys=True),
    }


def from_metadata(meta: Mapping[str, str] | None) -> AdapterHeader | None:
    """The adapter a file's metadata describes; None for a full snapshot (no adapter keys);
    `SnapshotError` for adapter metadata that does not parse."""
    if not meta or meta.get(KIND_KEY) is None:
        return None
    if meta.get(KIND_KEY) != "lora":
        raise SnapshotError(f"unknown adapter kind {meta.get(KIND_KEY)!r}")
    try:
        raw = json.loads(meta[SPEC_KEY])
        spec = AdapterSpec(
            rank=int(raw["rank"]),
            alpha=float(raw["alpha"]),
            target_modules=[str(t) for t in raw["target_modules"]],
            dropout=float(raw.get("dropout", 0.0)),
        )
        base = str(meta[BASE_KEY])
    except (KeyError, ValueError, TypeError) as exc:
        raise SnapshotError(f"adapter metadata does not parse: {exc!r}") from None
    if spec.rank < 1 or not base:
        raise SnapshotError(f"adapter metadata: rank {spec.rank}, base hash {base!r}")
    return AdapterHeader(spec, base)


def read_header(path: Path) -> AdapterHeader | None:
    """`from_metadata` of a safetensors file's header (no tensor is read)."""
    try:
        with safe_open(str(path), framework="numpy") as f:
            return from_metadata(f.metadata())
    except (OSError, SafetensorError) as exc:
        raise SnapshotError(f"cannot read safetensors header of {path}: {exc}") from None


def base_hash(model_dir: Path) -> str:
    """The hash of a model directory's weights: BLAKE3 over each weight file's name and BLAKE3
    hash, in name order (a sharded checkpoint's index and config files are not weights).
    Cached per file path, size and modification time, so a process hashes a base once."""
    files = sorted(
        p for p in Path(model_dir).iterdir() if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES)
    )
    if not files:
        raise SnapshotError(f"{model_dir}: no weight files to hash")
    outer = blake3.blake3()
    for path in files:
        outer.update(f"{path.name}\0{_file_hash(path)}\n".encode())
    return outer.hexdigest()


def _file_hash(path: Path) -> str:
    st = os.stat(path)
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _hash_cache:
        hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
        with open(path, "rb") as f:
            while block := f.read(8 << 20):
                hasher.update(block)
        _hash_cache[key] = hasher.hexdigest()
    return _hash_cache[key]


def check_base(header: AdapterHeader, own: str, where: Path | str) -> None:
    """`AdapterBaseMismatch` (one line) unless the adapter applies to the base hashed `own`."""
    if header.base_hash != own:
        raise AdapterBaseMismatch(
            f"adapter {where} was trained on another base model (base hash "
            f"{header.base_hash[:12]}…, this model's {own[:12]}…): refused"
        )


def tensor_names(module: str) -> tuple[str, str]:
    """The file names of one adapted module's A and B matrices (peft's saved names)."""
    return f"{PREFIX}{module}.lora_A.weight", f"{PREFIX}{module}.lora_B.weight"


def modules(names: Iterable[str]) -> list[str]:
    """The adapted modules of an adapter file's tensor names, in order; `SnapshotError` unless
    every name is an A or B matrix and every module has both."""
    found: dict[str, set[str]] = {}
    for name in names:
        stem, dot, last = name.removesuffix(".weight").rpartition(".")
        if not name.startswith(PREFIX) or not dot or last not in ("lora_A", "lora_B"):
            raise SnapshotError(f"adapter tensor {name!r} is not a LoRA matrix")
        found.setdefault(stem.removeprefix(PREFIX), set()).add(last)
    incomplete = [m for m, parts in found.items() if len(parts) != 2]
    if incomplete:
        raise SnapshotError(f"adapter lacks A or B of {', '.join(incomplete[:3])}")
    return list(found)


def peft_config(header: AdapterHeader, base_model: str = "") -> dict[str, object]:
    """peft's `adapter_config.json` of this adapter (what `PeftModel.from_pretrained` reads)."""
    spec = header.spec
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": spec.dropout,
        "target_modules": sorted(spec.target_modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "base_model_name_or_path": base_model,
    }


def write_peft_files(directory: Path, header: AdapterHeader, base_model: str = "") -> None:
    """`adapter_config.json` in `directory`, and `adapter_model.safetensors` as a hard link to
    its `model.safetensors` (peft's names for them; no byte written twice)."""
    config = peft_config(header, base_model)
    (directory / PEFT_CONFIG_FILE).write_text(json.dumps(config, indent=1, sort_keys=True))
    link = directory / PEFT_WEIGHTS_FILE
    if not link.exists():
        os.link(directory / "model.safetensors", link)

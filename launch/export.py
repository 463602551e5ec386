"""`asyncgrpo export RUN [--version N] --out DIR`: a run's policy as a model users keep.

A LoRA run's snapshot is an adapter (common/weights/adapter.py); `export` writes
- `DIR/`: a complete Hugging Face model directory with the adapter merged into the base
  (`W = W_base + (alpha/r) B A`, float32, common/weights/adapter_merge.py): `model.safetensors`,
  the base's config, generation config and tokenizer files (what transformers' and vLLM's
  `from_pretrained(DIR)` load);
- `DIR/adapter/`: the bare adapter in peft's layout (`adapter_model.safetensors`,
  `adapter_config.json`), for users who keep the base and the adapter apart
  (`PeftModel.from_pretrained(base, DIR/adapter)`, vLLM's `LoRARequest`).
A whole-model run's snapshot already is a model directory: `export` copies it (no `adapter/`).

The version is the run's final one (`final.json`; else the newest on disk) unless `--version`
names another that is still on disk (`snapshot.keep_last`). The base model is the run's
`model.path` on this host; an adapter trained on another base (its hash differs) is refused.
`DIR` must not exist; it is written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from common import config as C
from common.errors import ConfigError
from common.files import run_files as RF
from common.host.model_dir import local_model_dir
from common.weights import adapter as fmt
from common.weights import snapshot as snap

ADAPTER_DIR = "adapter"
_MODEL_FILES = (".json", ".jinja", ".model", ".txt", ".tiktoken")  # config and tokenizer files


@dataclass(frozen=True, slots=True)
class Exported:
    """What `export` wrote: the directory, the version, and whether it merged an adapter."""

    out: Path
    version: int
    adapter: bool
    num_bytes: int


def snapshot_of(run_dir: Path, version: int | None) -> tuple[int, Path]:
    """(version, its snapshot directory) of a run: `version`, or the one the run ended with."""
    from consumer.evaluation import final_version

    root = run_dir / RF.SNAPSHOTS
    chosen = final_version(run_dir) if version is None else version
    directory = snap.snapshot_dir(root, chosen)
    if not (directory / snap.MANIFEST_FILE).exists():
        kept = ", ".join(f"v{v}" for v in snap.list_versions(root)) or "none"
        raise ConfigError(f"{run_dir}: no snapshot v{chosen} on disk (kept: {kept})")
    return chosen, directory


def export(run_dir: Path, out: Path, *, version: int | None = None) -> Exported:
    """Write `out` (see the module doc); `ConfigError` for a bad run, version or `out`."""
    if out.exists():
        raise ConfigError(f"--out {out} already exists: name a new directory")
    if not (run_dir / RF.CONFIG).is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no {RF.CONFIG})")
    cfg = C.load(run_dir / RF.CONFIG)
    chosen, directory = snapshot_of(run_dir, version)
    weights = directory / snap.WEIGHTS_FILE
    header = fmt.read_header(weights)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        if header is None:
            shutil.copytree(directory, tmp, ignore=shutil.ignore_patterns("chunks.json", "*.delta"))
        else:
            _merged(local_model_dir(cfg.model.path), weights, header, tmp)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    size = sum(p.stat().st_size for p in out.rglob("*.safetensors"))
    return Exported(out, chosen, header is not None, size)


def _merged(base_dir: Path, weights: Path, header: fmt.AdapterHeader, tmp: Path) -> None:
    """The base with the adapter merged, saved as a model directory, and the bare adapter."""
    import torch
    from transformers import AutoModelForCausalLM

    from common.weights.adapter_merge import merge_file

    fmt.check_base(header, fmt.base_hash(base_dir), weights)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    merge_file(model, weights, base_dir)
    model.save_pretrained(tmp)
    for extra in sorted(base_dir.iterdir()):  # tokenizer and chat template, as the base has them
        if extra.is_file() and extra.suffix in _MODEL_FILES and not (tmp / extra.name).exists():
            shutil.copyfile(extra, tmp / extra.name)
    adapter = tmp / ADAPTER_DIR
    adapter.mkdir()
    shutil.copyfile(weights, adapter / fmt.PEFT_WEIGHTS_FILE)
    config = fmt.peft_config(header, str(base_dir))
    (adapter / fmt.PEFT_CONFIG_FILE).write_text(json.dumps(config, indent=1, sort_keys=True))

"""`model.path` to a local Hugging Face model directory: a directory, or a model name already in
this host's Hugging Face cache (read offline: nothing is downloaded). The learner and the command
line resolve it alike."""

from __future__ import annotations

import os
from pathlib import Path

from common.errors import ConfigError

DEMO_RECIPE_FILE = "demo_recipe.json"  # what marks the embedded demo model (launch/demo_model.py)
DEMO_CHARS_HINT = "the demo model's tokenizer knows only digits, + - * = and space"


def make_readable(directory: Path) -> None:
    """A model directory written here, readable by the group and others as pip installs files
    (0755 under the usual umask 022): `tempfile.mkdtemp`, which builds go through, makes it
    0700. Its files, written by `open`, already follow the umask (0644)."""
    umask = os.umask(0)
    os.umask(umask)
    directory.chmod(0o777 & ~umask)


def is_demo_model(model_dir: Path | None) -> bool:
    """Whether `model_dir` is the embedded demo model (it holds its recipe)."""
    return model_dir is not None and (model_dir / DEMO_RECIPE_FILE).is_file()


def local_model_dir(path: str) -> Path:
    """`model.path` as an absolute local Hugging Face model directory (the command line has
    already turned 'demo' into the embedded model's directory): a directory holding
    config.json, or a model name (`Qwen/Qwen2.5-0.5B`) already in this host's Hugging Face cache
    (read offline: nothing is downloaded)."""
    p = Path(path).expanduser()
    if (p / "config.json").exists():
        return p.resolve()
    cached = _cached_model(path) if not p.exists() else None
    if cached is None:
        from huggingface_hub import constants

        raise ConfigError(
            f"model.path = {path!r} is neither a Hugging Face model directory on the consumer's "
            f"host (no config.json) nor a model in its Hugging Face cache "
            f"({constants.HF_HUB_CACHE}); nothing is downloaded: pass a directory, or fetch "
            "the model into the cache first (`huggingface-cli download NAME`)"
        )
    return cached


def _cached_model(name: str) -> Path | None:
    """The snapshot directory of model `name` in the local Hugging Face cache (offline), or
    None when it is not there (or `name` is not a model name)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        found = Path(snapshot_download(name, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        return None
    return found if (found / "config.json").exists() else None

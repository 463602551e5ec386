"""`model.path` to a local Hugging Face model directory: a directory, or a model name
(`Qwen/Qwen2.5-0.5B-Instruct`) as on the Hugging Face Hub. A name is read from this host's
Hugging Face cache; one not there yet is downloaded into it once (its weights, config and
tokenizer files: `MODEL_FILES`), saying so and how long it has taken every 10 s besides
huggingface_hub's own progress bars, unless `HF_HUB_OFFLINE=1` keeps this host offline (then a
name not cached is one line saying so). The learner and the command line resolve it alike."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from common.errors import ConfigError, first_line
from common.progress import heartbeat

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
    config.json, or a model name, from the Hugging Face cache or downloaded into it (see the
    module docstring)."""
    p = Path(path).expanduser()
    if (p / "config.json").exists():
        return p.resolve()
    if p.exists() or not is_hub_name(path):
        raise ConfigError(
            f"model.path = {path!r} is neither a Hugging Face model directory on the consumer's "
            "host (no config.json) nor a model name as on the Hugging Face Hub (ORG/NAME)"
        )
    cached = _cached_model(path)
    if cached is not None:
        return cached
    from huggingface_hub import constants

    if hub_offline():
        raise ConfigError(
            f"model.path = {path!r} is neither a Hugging Face model directory on the consumer's "
            f"host (no config.json) nor a model in its Hugging Face cache "
            f"({constants.HF_HUB_CACHE}), and HF_HUB_OFFLINE=1: nothing is downloaded: pass a "
            "directory, or fetch the model into the cache first (`hf download NAME`)"
        )
    return _download(path, constants.HF_HUB_CACHE)


# what a model needs of its repository: weights, config, tokenizer (not other formats' copies)
MODEL_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


def hub_offline() -> bool:
    """Whether `HF_HUB_OFFLINE` keeps this host off the Hugging Face Hub (read now, as
    huggingface_hub reads it: 1, ON, YES or TRUE)."""
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def is_hub_name(path: str) -> bool:
    """`ORG/NAME` or `NAME` as the Hub spells repositories (not a path: `./x`, `/x`, `~/x`)."""
    return _NAME.fullmatch(path) is not None and ".." not in path


def _download(name: str, cache: str) -> Path:
    """Model `name`'s `MODEL_FILES` from the Hub into the cache; `ConfigError` in one line when
    that fails (no network, no such model, a gated one)."""
    import huggingface_hub

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    say(
        f"downloading the model {name} from the Hugging Face Hub into {cache} (once; "
        "HF_HUB_OFFLINE=1 keeps this host offline)"
    )
    try:
        with heartbeat(f"downloading the model {name}", say):
            found = Path(huggingface_hub.snapshot_download(name, allow_patterns=MODEL_FILES))
    except Exception as exc:  # huggingface_hub raises many kinds (HTTP, OS, validation)
        raise ConfigError(
            f"model.path = {name!r}: not a local directory, and downloading it from the "
            f"Hugging Face Hub failed: {type(exc).__name__}: {first_line(exc)}"
        ) from None
    if not (found / "config.json").exists():
        raise ConfigError(f"model.path = {name!r}: the Hub's copy has no config.json")
    return found


def _cached_model(name: str) -> Path | None:
    """The snapshot directory of model `name` in the local Hugging Face cache (offline), or
    None when it is not there (or `name` is not a model name)."""
    import huggingface_hub
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        found = Path(huggingface_hub.snapshot_download(name, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, OSError):
        return None
    return found if (found / "config.json").exists() else None

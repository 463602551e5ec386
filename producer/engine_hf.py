"""The `hf` engine: a transformers causal LM sampled by our own loop (CPU or GPU).

Why our own loop rather than `model.generate`: the log-prob we report must be exactly that of
the sampled token under the sampling distribution, `log_softmax(logits / temperature)` — the
same function the learner uses (`consumer.loss.sampled_logprobs`), so behaviour and learner
log-probs agree to float32 rounding for the same weights.

Invariants (besides the contract in producer/engine.py):
- `version` is -1 until the first `load_weights`: a producer loads a published snapshot, version
  0 included, before it generates (the snapshot's dtype may differ from the base checkpoint's).
- Generation and weight loading never overlap (one lock; torch work runs in a worker thread, so
  the producer's event loop keeps answering heartbeats).
- `load_weights` checks every tensor's name and shape before copying anything: a file that does
  not fit raises `SnapshotError` and leaves weights and version untouched. Tied parameters (e.g.
  `lm_head.weight` = `model.embed_tokens.weight`) may be absent from the file.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from common.errors import SnapshotError
from consumer.loss import sampled_logprobs
from producer.engine import Completion, SamplingParams


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class HFEngine:
    def __init__(self, model_dir: Path, *, device: str = "auto", dtype: str = "float32", seed: int = 0) -> None:
        from transformers import AutoModelForCausalLM

        self.device = _device(device)
        torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype).to(self.device)
        self.model.eval()
        eos = self.model.generation_config.eos_token_id or self.model.config.eos_token_id
        self._eos = {int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None}
        self._version = -1
        self._seed = seed
        self._calls = 0
        self._lock = asyncio.Lock()

    @property
    def version(self) -> int:
        return self._version

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_input_embeddings().num_embeddings)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        self._calls += 1
        seed = params.seed if params.seed is not None else self._seed * 1_000_003 + self._calls
        async with self._lock:
            version = self._version
            ids, logps, stops = await asyncio.to_thread(self._sample, prompt_ids, params, seed)
        out = []
        for row_ids, row_logp, stopped in zip(ids, logps, stops, strict=True):
            out.append(
                Completion(
                    token_ids=np.asarray(row_ids, np.int32),
                    logprobs=np.minimum(np.asarray(row_logp, np.float32), 0.0),
                    finish_reason="stop" if stopped else "length",
                    versions=np.full(len(row_ids), version, np.int32),
                )
            )
        return out

    @torch.inference_mode()
    def _sample(
        self, prompt_ids: list[int], params: SamplingParams, seed: int
    ) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        n, dev = params.n, self.device
        gen = torch.Generator(device=dev).manual_seed(seed)
        stop_ids = torch.tensor(sorted(self._eos | set(params.stop_token_ids)), device=dev)
        input_ids = torch.tensor([prompt_ids] * n, device=dev)
        out = self.model(input_ids=input_ids, use_cache=True)
        cache = out.past_key_values
        logits = out.logits[:, -1:]
        tokens, logps = [], []
        done = torch.zeros(n, dtype=torch.bool, device=dev)
        lengths = torch.full((n,), params.max_new_tokens, device=dev)
        for step in range(params.max_new_tokens):
            probs = torch.softmax(logits[:, -1].float() / params.temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=gen)  # [n, 1]
            logp = sampled_logprobs(logits, tok, temperature=params.temperature)  # [n, 1]
            tokens.append(tok)
            logps.append(logp)
            newly = ~done & torch.isin(tok[:, 0], stop_ids)
            lengths = torch.where(newly, torch.full_like(lengths, step + 1), lengths)
            done |= newly
            if bool(done.all()) or step + 1 == params.max_new_tokens:
                break
            out = self.model(input_ids=tok, past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits
        all_ids = torch.cat(tokens, dim=1).tolist()
        all_logp = torch.cat(logps, dim=1).tolist()
        lens = lengths.tolist()
        return (
            [row[:k] for row, k in zip(all_ids, lens, strict=True)],
            [row[:k] for row, k in zip(all_logp, lens, strict=True)],
            done.tolist(),
        )

    async def load_weights(self, directory: Path, version: int) -> None:
        async with self._lock:
            await asyncio.to_thread(self._load, directory / "model.safetensors")
            self._version = version

    def _load(self, path: Path) -> None:
        try:
            incoming = load_file(path)
        except (OSError, SafetensorError) as exc:
            raise SnapshotError(f"cannot read {path}: {exc}") from None
        own = self.model.state_dict()
        unexpected = sorted(set(incoming) - set(own))
        wrong = [k for k, t in incoming.items() if k in own and own[k].shape != t.shape]
        present_ptrs = {own[k].data_ptr() for k in incoming if k in own}
        missing = [k for k in own if k not in incoming and own[k].data_ptr() not in present_ptrs]
        if unexpected or wrong or missing:
            raise SnapshotError(
                f"{path} does not fit the model: unexpected {unexpected[:3]}, "
                f"wrong shape {wrong[:3]}, missing {missing[:3]}"
            )
        with torch.no_grad():
            for name, tensor in incoming.items():
                own[name].copy_(tensor.to(own[name].dtype))

    async def close(self) -> None:
        return None

"""The hf engine's running batch: every row of every admitted request, one forward per token.

Owns: prefilling requests (prompts of different lengths, left-padded), merging them into the
rows already decoding, sampling every row with its request's own random stream, recording tokens
and log-probs, and dropping rows that finished or whose request was withdrawn. Does not own:
threads, asyncio, weight reloads or when to admit (producer/engines/hf.py decides that).

Shapes: B rows in the batch (the alive rows of all members, member after member), S cached
positions, V vocabulary, k requests being admitted. A request asks for n rows of one prompt.

Per token step, for all B rows at once (`Batch.sample`, then `Batch.forward`):

    z = logits.float() / T                                   (T: the row's temperature)
    token = argmax(z + Gumbel)     Gumbel = -log(-log(u)), u ~ U[0,1)^(n x V) from the request's
                                   own generator, drawn for all n rows of the request every step
    logp = sampled_logprobs(logits, token, T) = log_softmax(z)[token]   (the learner's rule)
    logp = min(logp, 0)            (a token of probability 1 can round to +1e-8)

With truncated sampling (the request's `truncation`: top-k, top-p, min-p,
common/sampling/kept_set.py), z is `truncated_logits(logits, truncation, T)`: -inf outside the kept
set K, vLLM's order of operations (temperature, min-p, top-k with ties and the max_kept cap, top-p).
The same Gumbel noise then samples exactly q = softmax over K, logp = log_softmax(z)[token] is log
q, and the row's K (its finite entries other than the token, ascending) is recorded with the token.

Gumbel-max samples exactly softmax(z). Because every request draws its noise from its own
generator, n x V numbers per step, whichever rows of it are still alive, a request's tokens depend
only on its seed and the logits of its own rows: the same seed and weights give the same
completions whichever other requests share the batch (up to float rounding of a forward of a
different shape, which can flip a token only at a near-tie).

Layout of the KV cache: left-padded. A row's real tokens sit at the right end of the S cached
positions; `mask_BS` is 1 on them; `pos_B` is the position id of the row's next token (its real
length so far), so padding never shifts positions. Admission prefills the k new prompts once
(left-padded to the longest), repeats each request's cache row n times, and (when rows are already
decoding) left-pads the shorter of the two caches to the longer and concatenates them along the
batch. When rows leave, leading positions no row attends to any more are cut off.

Invariants: a row is sampled exactly once per forward; a request's rows are contiguous and in
row order; rows stop at their first stop token (kept, "stop") or after `max_new_tokens`
("length"); a finished or withdrawn row is never fed again. Merging needs plain `DynamicLayer`
caches (full attention); for other cache types (`mergeable` is False) the engine admits requests
only into an empty batch. Left padding itself is exact with a sliding window too: the padding
sits left of every real token, so the last W positions hold the same real tokens as without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from inspect import signature
from typing import Any

import numpy as np
import torch
from transformers.cache_utils import DynamicLayer

from common.sampling import kept_set
from common.sampling.kept_set import NO_TRUNCATION, Truncation
from common.sampling.logprobs import sampled_logprobs, truncated_logits
from producer.engines.base import Completion
from producer.engines.hf_prefix import PrefixCache


@dataclass(eq=False)
class Request:
    """n completions of one prompt; filled in by the batch, read when it finishes."""

    prompt_ids: list[int]
    n: int
    temperature: float
    max_new_tokens: int
    seed: int
    is_stop_V: np.ndarray  # bool per vocabulary id: the request's stop tokens and the model's EOS
    truncation: Truncation = NO_TRUNCATION
    waiter: Any = None  # whoever waits for the result (the engine's future); never read here
    cancelled: bool = False  # set from another thread: drop the rows at the next step
    version: int = -1  # weights version the rows are sampled with (set at admission)
    generator: torch.Generator | None = None
    steps: int = 0  # tokens sampled per row so far
    alive_a: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # rows in batch
    ids_nL: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.int32))
    logp_nL: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    lengths_n: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    stopped_n: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    kept_nL: list[list[np.ndarray]] = field(default_factory=list)  # per row, per step: the others

    def start(self, version: int, device: torch.device) -> None:
        self.version = version
        self.generator = torch.Generator(device=device).manual_seed(self.seed)
        self.alive_a = np.arange(self.n)
        self.ids_nL = np.zeros((self.n, self.max_new_tokens), np.int32)
        self.logp_nL = np.zeros((self.n, self.max_new_tokens), np.float32)
        self.lengths_n = np.zeros(self.n, np.int64)
        self.stopped_n = np.zeros(self.n, bool)
        self.kept_nL = [[] for _ in range(self.n)] if self.truncation.active else []

    def record(
        self, tokens_a: np.ndarray, logp_a: np.ndarray, kept_a: list[np.ndarray] | None = None
    ) -> np.ndarray:
        """Store one step for the alive rows (with each row's other kept ids when truncated);
        return which of them go on (bool per alive row)."""
        rows, step = self.alive_a, self.steps
        self.ids_nL[rows, step] = tokens_a
        self.logp_nL[rows, step] = np.minimum(logp_a, 0.0)
        if self.kept_nL:
            assert kept_a is not None, "a truncated request's rows carry kept sets"
            for row, others in zip(rows.tolist(), kept_a, strict=True):
                self.kept_nL[row].append(others)
        self.steps = step + 1
        stop_a = self.is_stop_V[tokens_a]
        self.stopped_n[rows[stop_a]] = True
        go_on_a: np.ndarray = ~stop_a & (self.steps < self.max_new_tokens)
        self.lengths_n[rows[~go_on_a]] = self.steps
        self.alive_a = rows[go_on_a]
        return go_on_a

    @property
    def finished(self) -> bool:
        return self.steps > 0 and len(self.alive_a) == 0

    def completions(self) -> list[Completion]:
        return [
            Completion(
                token_ids=self.ids_nL[i, :k].copy(),
                logprobs=self.logp_nL[i, :k].copy(),
                finish_reason="stop" if self.stopped_n[i] else "length",
                versions=np.full(k, self.version, np.int32),
                kept=kept_set.from_lists(self.kept_nL[i]) if self.kept_nL else kept_set.KeptSets(),
            )
            for i, k in enumerate(self.lengths_n.tolist())
        ]


class Batch:
    """The rows being decoded; see the module docstring. Used by one thread only."""

    def __init__(self, model: Any, device: torch.device, *, pad_id: int = 0) -> None:
        self.model = model
        self.device = device
        self.pad_id = pad_id
        self.members: list[Request] = []
        self.cache: Any = None
        self.mask_BS = torch.zeros((0, 0), dtype=torch.long, device=device)
        self.pos_B = torch.zeros(0, dtype=torch.long, device=device)
        self.logits_BV: torch.Tensor | None = None  # logits of each row's next token
        self.num_forwards = 0  # decode forwards (one per token step) plus prefills
        self.num_rows_forwarded = 0  # rows summed over those forwards
        self._next_tokens_B = self.pos_B  # the tokens `forward` feeds (set by `sample`)
        self.prefix = PrefixCache()  # the prompts' common prefix (its cache: the weights')
        params = signature(model.forward).parameters
        self._keep_last = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        # The cache's name: `cache` since transformers 5.24 (`past_key_values` is deprecated
        # there, to be removed in 5.40), `past_key_values` before.
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        with torch.inference_mode():  # which cache this model builds: one token tells
            one = torch.zeros((1, 1), dtype=torch.long, device=device)
            layers = getattr(_cache_of(model(input_ids=one, use_cache=True)), "layers", None)
        # Caches merge only for plain full-attention layers (other layers keep more state).
        self.mergeable = layers is not None and all(type(x) is DynamicLayer for x in layers)

    @property
    def empty(self) -> bool:
        return not self.members

    @property
    def num_rows(self) -> int:
        return int(self.pos_B.shape[0])

    # -- admission --------------------------------------------------------------------------
    @torch.inference_mode()
    def admit(self, requests: list[Request], version: int) -> None:
        """Prefill `requests` (each prompt once; after the cached common prefix where it has it:
        producer/engines/hf_prefix.py) and add n rows per request to the batch."""
        assert requests
        assert self.empty or self.mergeable, "the engine admits into a busy batch only if mergeable"
        for r in requests:
            r.start(version, self.device)
        shared: list[Request] = []
        if self.mergeable:  # a prefix cache joins caches too
            self.prefix.observe([r.prompt_ids for r in requests])
            shared = [r for r in requests if self.prefix.fits(r.prompt_ids)]
        plain = [r for r in requests if not any(r is s for s in shared)]
        for part, prefixed in ((shared, True), (plain, False)):
            if part:
                self._add(part, *self._prefill(part, prefixed=prefixed))

    def _prefill(
        self, requests: list[Request], *, prefixed: bool
    ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One forward of `requests`' prompts (their suffixes after the cached prefix when
        `prefixed`); (cache, mask, next positions, next-token logits) of their n rows each."""
        start = len(self.prefix.ids) if prefixed else 0
        tails = [r.prompt_ids[start:] for r in requests]
        width = max(len(t) for t in tails)
        ids_kP = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        mask_kP = torch.zeros((len(requests), start + width), dtype=torch.long)
        mask_kP[:, :start] = 1
        for i, tail in enumerate(tails):
            ids_kP[i, width - len(tail) :] = torch.tensor(tail)
            mask_kP[i, start + width - len(tail) :] = 1
        ids_kP, mask_kP = ids_kP.to(self.device), mask_kP.to(self.device)
        cached = (
            {self._cache_kw: self.prefix.repeated(self._prefix_cache, len(requests))}
            if prefixed
            else {}
        )
        out = self.model(
            input_ids=ids_kP,
            attention_mask=mask_kP,
            position_ids=(mask_kP.cumsum(-1) - 1).clamp(min=0)[:, start:],
            use_cache=True,
            **self._keep_last,
            **cached,
        )
        self._count(len(requests))
        repeat = torch.tensor([r.n for r in requests], device=self.device)
        index = torch.repeat_interleave(torch.arange(len(requests), device=self.device), repeat)
        cache = _cache_of(out)
        cache.batch_select_indices(index)
        pos = torch.tensor([len(r.prompt_ids) for r in requests], device=self.device)[index]
        return cache, mask_kP[index], pos, out.logits[:, -1][index]

    def _prefix_cache(self, ids: torch.Tensor) -> Any:
        """The KV cache of a forward of the prefix `ids` [1, P] alone."""
        out = self.model(input_ids=ids.to(self.device), use_cache=True, **self._keep_last)
        self._count(1)
        return _cache_of(out)

    def _add(
        self,
        requests: list[Request],
        cache: Any,
        mask: torch.Tensor,
        pos: torch.Tensor,
        logits: torch.Tensor,
    ) -> None:
        """Put prefilled rows into the batch (merged into the rows already decoding)."""
        if self.empty:
            self.cache, self.mask_BS, self.pos_B, self.logits_BV = cache, mask, pos, logits
        else:
            assert self.logits_BV is not None
            self.mask_BS = _merge_left_padded(self.cache, self.mask_BS, cache, mask)
            self.pos_B = torch.cat([self.pos_B, pos])
            self.logits_BV = torch.cat([self.logits_BV, logits])
        self.members.extend(requests)

    # -- one token step ----------------------------------------------------------------------
    @torch.inference_mode()
    def sample(self) -> list[Request]:
        """Sample the next token of every row; drop finished rows; return finished requests."""
        assert self.logits_BV is not None
        logits_BV = self.logits_BV
        vocab = logits_BV.shape[-1]
        uniform_BV = torch.cat(
            [
                torch.rand((r.n, vocab), generator=r.generator, device=self.device)[r.alive_a]
                for r in self.members
            ]
        )
        gumbel_BV = -torch.log(-torch.log(uniform_BV))
        spans = self._spans()
        first = self.members[0]
        if len({(r.temperature, r.truncation) for r in self.members}) == 1:
            tokens_B, logp_B, kept_B = _gumbel_max(
                logits_BV, gumbel_BV, first.temperature, first.truncation
            )
        else:  # several sampling settings: each member's rows with its own
            parts = [
                _gumbel_max(logits_BV[s], gumbel_BV[s], r.temperature, r.truncation)
                for r, s in spans
            ]
            tokens_B, logp_B = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
            kept_B = [k for p in parts for k in (p[2] or [None] * len(p[0]))]
        tokens_np, logp_np = tokens_B.cpu().numpy(), logp_B.float().cpu().numpy()
        keep_B = np.concatenate(
            [r.record(tokens_np[s], logp_np[s], kept_B[s] if kept_B else None) for r, s in spans]
        )
        finished = [r for r in self.members if r.finished]
        self.members = [r for r in self.members if not r.finished]
        index = self._select(keep_B)
        self._next_tokens_B = tokens_B if index is None else tokens_B[index]
        return finished

    def _spans(self) -> list[tuple[Request, slice]]:
        """Each member with the slice of batch rows that are its alive rows."""
        out, start = [], 0
        for r in self.members:
            out.append((r, slice(start, start + len(r.alive_a))))
            start += len(r.alive_a)
        return out

    @torch.inference_mode()
    def forward(self) -> None:
        """Feed every row its sampled token: the logits of the next step."""
        assert not self.empty
        tokens_B = self._next_tokens_B
        ones = torch.ones((self.num_rows, 1), dtype=self.mask_BS.dtype, device=self.device)
        self.mask_BS = torch.cat([self.mask_BS, ones], dim=1)
        out = self.model(
            input_ids=tokens_B[:, None],
            attention_mask=self.mask_BS,
            position_ids=self.pos_B[:, None],
            use_cache=True,
            **{self._cache_kw: self.cache},
        )
        self._count(self.num_rows)
        self.cache, self.logits_BV = _cache_of(out), out.logits[:, -1]
        self.pos_B = self.pos_B + 1

    @torch.inference_mode()
    def withdraw(self, requests: list[Request]) -> None:
        """Drop the rows of `requests` (cancelled by their callers) from the batch."""
        gone = {id(r) for r in requests}
        keep_B = np.zeros(self.num_rows, bool)
        for r, s in self._spans():
            keep_B[s] = id(r) not in gone
        self.members = [r for r in self.members if id(r) not in gone]
        self._select(keep_B)

    @torch.inference_mode()
    def clear(self) -> list[Request]:
        """Drop everything (after a failed forward); return the members that were in it."""
        members, self.members = self.members, []
        self._select(np.zeros(self.num_rows, bool))
        return members

    # -- bookkeeping ----------------------------------------------------------------------------
    def _select(self, keep_B: np.ndarray) -> torch.Tensor | None:
        """Keep the rows where `keep_B` is True (the cache included); the index, None = all."""
        if keep_B.all():
            return None
        index = torch.from_numpy(np.flatnonzero(keep_B)).to(self.device)
        if len(index) == 0:
            self.cache, self.logits_BV = None, None
            self.mask_BS, self.pos_B = self.mask_BS[:0, :0], self.pos_B[:0]
            return index
        self.cache.batch_select_indices(index)
        self.mask_BS, self.pos_B = self.mask_BS[index], self.pos_B[index]
        if self.logits_BV is not None:
            self.logits_BV = self.logits_BV[index]
        if self.mergeable:  # cut leading positions that no remaining row attends to
            first = int(self.mask_BS.any(0).int().argmax())
            if first > 0:
                self.mask_BS = self.mask_BS[:, first:]
                for layer in self.cache.layers:
                    layer.keys = layer.keys[..., first:, :]
                    layer.values = layer.values[..., first:, :]
        return index

    def _count(self, rows: int) -> None:
        self.num_forwards += 1
        self.num_rows_forwarded += rows


def _cache_of(out: Any) -> Any:
    """The KV cache a forward returned: `out.cache` (transformers >= 5.24) or `past_key_values`."""
    return out["cache"] if "cache" in out else out["past_key_values"]


def _gumbel_max(
    logits_BV: torch.Tensor, gumbel_BV: torch.Tensor, temperature: float, truncation: Truncation
) -> tuple[torch.Tensor, torch.Tensor, list[Any] | None]:
    """(token, log-prob, other kept ids or None) per row: argmax(z + Gumbel), log_softmax(z)
    at the token, z = logits / T, truncated to the kept set when `truncation` is active (then
    the third item lists, per row, the kept ids other than the token, ascending, int32).
    T = 0 is greedy (evaluation leases only, never trained): the top token, its log-prob at
    T = 1."""
    if temperature == 0:
        tokens_B = logits_BV.argmax(-1)
        logp_B = sampled_logprobs(logits_BV[:, None], tokens_B[:, None], temperature=1.0)
        return tokens_B, logp_B[:, 0], None
    if not truncation.active:
        tokens_B = (logits_BV.float() / temperature + gumbel_BV).argmax(-1)
        logp_B = sampled_logprobs(logits_BV[:, None], tokens_B[:, None], temperature=temperature)
        return tokens_B, logp_B[:, 0], None
    z_BV = truncated_logits(logits_BV, truncation, temperature=temperature)
    tokens_B = (z_BV + gumbel_BV).argmax(-1)
    logp_B = z_BV.gather(-1, tokens_B[:, None])[:, 0] - torch.logsumexp(z_BV, dim=-1)
    others_BV = torch.isfinite(z_BV)
    others_BV[torch.arange(len(tokens_B), device=z_BV.device), tokens_B] = False
    ids = others_BV.nonzero()[:, 1].to(torch.int32).cpu().numpy()  # row-major: ascending ids
    counts = others_BV.sum(-1).cpu().numpy()
    return tokens_B, logp_B, np.split(ids, np.cumsum(counts)[:-1])


def _merge_left_padded(
    cache: Any, mask_BS: torch.Tensor, new_cache: Any, new_mask_bP: torch.Tensor
) -> torch.Tensor:
    """Append `new_cache`'s rows to `cache` in place (left-padding the shorter one); new mask."""
    width = max(mask_BS.shape[1], new_mask_bP.shape[1])

    def pad(t: torch.Tensor, dim: int) -> torch.Tensor:
        missing = width - t.shape[dim]
        if missing == 0:
            return t
        shape = list(t.shape)
        shape[dim] = missing
        return torch.cat([t.new_zeros(shape), t], dim=dim)

    for old, new in zip(cache.layers, new_cache.layers, strict=True):
        old.keys = torch.cat([pad(old.keys, -2), pad(new.keys, -2)])
        old.values = torch.cat([pad(old.values, -2), pad(new.values, -2)])
    return torch.cat([pad(mask_BS, 1), pad(new_mask_bP, 1)])

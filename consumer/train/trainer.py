"""The learner's model, optimizer and one optimizer step per batch of groups (single device).

What it owns: the policy (fp32 master weights), AdamW with its learning-rate schedule
(consumer/train/schedule.py: warm-up, then constant, linear or cosine), gradient clipping,
micro-batching by a token budget, an optional frozen reference model (beta > 0). What it does not
do: sockets, staleness decisions, snapshots on disk (consumer/snapshots/publisher.py), the
checkpoint directory (consumer/train/checkpoint.py: this trainer writes its part into it).

Publication: `weights()` are the live tensors the publisher copies; on a GPU that copy is only
enqueued, and `hold_weights(fence)` makes the next optimizer step (the first thing that changes
a weight) wait for it on the GPU — the training thread itself never waits.

Conventions:
- Log-probs are of the sampling distribution, the rule of
  `common.sampling.logprobs.sampled_logprobs` (logits divided by `sampling.temperature`, exactly as
  the producers' engines do), computed from hidden states by consumer/train/lm_head.py. With
  truncated sampling every log-prob the loss sees (current, old, reference) is renormalised over the
  token's kept set as the engine recorded it (common/sampling/kept_set.py); a token whose set is
  unknown is not trained. Per step:
  `kept_mass_mean` (the policy's mass on the kept sets, before the update), `kept_size_mean`
  (|K|; the vocabulary size without truncation), `tokens_kept_unknown`.
- `model.lora.enabled`: a LoRA adapter on the frozen base (consumer/train/adapter.py) is the
  trainable state: the optimizer, `weights()` (what is published) and the checkpoint hold the
  adapter only; `adapter` is its header (spec, base hash), None for a whole model. The
  reference policy (beta > 0) is then the base itself: the same model with its adapter off
  (`adapter.disabled`), no second copy of the weights.
- `model.dtype = "bfloat16"` runs forward/backward under CUDA autocast in bf16 with fp32 master
  weights and optimizer state (CPU runs stay fp32).
- `updates_per_batch = 1` (default): one optimizer step consumes the batch, `old_logp` is
  `logp.detach()` and no extra forward is paid (`loss.needs_old_logp_pass`). With k > 1 updates
  the rows are split into k mini-batches and `old_logp` is computed once, before the first one.
- Micro-batch losses use global normalisers (`batching.loss_normalisers` of the whole update),
  so accumulating their gradients equals the gradient of the full-batch loss.
- The forward (consumer/train/forward.py) runs the decoder, then the LM head only at the
  positions that predict completion tokens, chunk by chunk (`train.logprob_chunk_mib`): no
  full-vocabulary logits of the whole micro-batch ever exist.
- Layout: rows packed without padding (flash-attn varlen or flex_attention) or right-padded
  (SDPA; no mask when a micro-batch's rows have equal length), per consumer/train/attention.py; the
  choice is logged once and reported in every step's metrics (`attention`, `padding_frac`).
  Micro-batches are planned by real tokens when packed, by padded size when padded.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from functools import partial
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from common.config import Config
from common.host.core_board import Share
from common.host.device import resolve_device
from common.wire import Group, SnapshotInfo
from consumer.snapshots.weights_buffer import Fence
from consumer.train import adapter as LA
from consumer.train import attention as A
from consumer.train import batch_advantages as BA
from consumer.train import checkpoint, sharded_checkpoint
from consumer.train import layer_threads as LT
from consumer.train import loss as L
from consumer.train import shared_prompt as SP
from consumer.train import step_metrics as SM
from consumer.train.batching import (
    MicroBatch,
    Row,
    collate,
    loss_normalisers,
    plan_micro_batches,
    rows_of,
)
from consumer.train.forward import CompletionForward, check_plain_head, compile_layers
from consumer.train.lm_head import HeadOut
from consumer.train.options import advantage_options, loss_options
from consumer.train.schedule import make_scheduler

log = logging.getLogger("asyncgrpo.consumer")


class DeviceTrainer:
    """The `Trainer` (consumer/train/protocol.py) of one process on one device."""

    def __init__(self, cfg: Config, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        self.loss_options = loss_options(cfg)
        self.advantage_options = advantage_options(cfg)
        self.device = resolve_device(cfg.model.device)
        if cfg.model.torch_threads:
            torch.set_num_threads(cfg.model.torch_threads)
        if cfg.model.deterministic:
            use_deterministic_kernels()
        torch.manual_seed(cfg.run.seed)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.to(self.device)  # type: ignore[arg-type]  # transformers' wrapped `to`
        # LoRA: the adapter is the trainable state, published and checkpointed (adapter.py)
        lora = cfg.model.lora
        self.adapter = LA.attach(self.model, lora, model_dir) if lora.enabled else None
        self._autocast = cfg.model.dtype == "bfloat16" and self.device.type == "cuda"
        self.attention = A.choose_attention(
            cfg.model.attention,
            device_type=self.device.type,
            half_precision=self._autocast,
            flash_impl=A.installed_flash(),
            flex_ok=A.flex_available(),
            full_attention=SP.full_attention_only(self.model.config),
        )
        self._shapes = SP.Shapes.of(self.model.config)
        log.info("learner attention: %s", self.attention.describe())
        self.policy = self._forward_module(self.model)
        if cfg.model.gradient_checkpointing:  # the name transformers 5 gave it, else the old one
            enable = getattr(self.model, "activation_checkpointing_enable", None)
            (enable or self.model.gradient_checkpointing_enable)()
            if self.adapter:  # frozen embeddings: the checkpointed layers' input needs a grad
                self.model.enable_input_require_grads()  # type: ignore[no-untyped-call]
        self.model.config.use_cache = False
        self.model.train()
        embeddings = cast(torch.nn.Embedding, self.model.get_input_embeddings())
        self.vocab_size = int(embeddings.num_embeddings)
        self.pad_id = _pad_id(self.model.config)
        t = cfg.train
        self.optimizer = torch.optim.AdamW(
            LA.trainable(self.model) if self.adapter else self.model.parameters(),
            lr=t.lr,
            betas=(t.betas[0], t.betas[1]),
            weight_decay=t.weight_decay,
            fused=self.device.type == "cuda",
        )
        self.scheduler = make_scheduler(self.optimizer, cfg)
        self.ref_model = None
        self.ref_policy: CompletionForward | None = None
        if cfg.loss.beta > 0 and self.adapter:  # the base: this model with the adapter off
            self.ref_policy = self.policy
        elif cfg.loss.beta > 0:
            self.ref_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
            self.ref_model.to(self.device).eval().requires_grad_(False)  # type: ignore[arg-type]
            self.ref_policy = self._forward_module(self.ref_model)
        self._weights_fence: Fence | None = None  # a copy of the weights still in flight
        self._cores: Share | None = None  # the host's cores shared with the run's producers
        self._pass_threads: list[int] = []  # the step's units' torch threads, in order
        # on a CPU the board's threads are taken again at every decoder layer (layer_threads.py)
        self._layers = (
            LT.LayerThreads(self.model, self._retake_threads)
            if self.device.type == "cpu" and not cfg.model.compile
            else None
        )

    def _forward_module(self, model: Any) -> CompletionForward:
        A.use(model, self.attention)
        check_plain_head(model)
        if self.cfg.model.compile:
            compile_layers(model)
        return CompletionForward(
            model,
            self.attention,
            temperature=self.cfg.sampling.temperature,
            chunk_mib=self.cfg.train.logprob_chunk_mib,
        )

    @property
    def world_size(self) -> int:
        """Ranks training this policy together (consumer/train/sharded.py: more)."""
        return 1

    # ------------------------------------------------------------------------------------------
    def step(self, groups: list[Group]) -> dict[str, Any]:
        """One optimizer step (or `updates_per_batch` steps) on these groups; returns metrics."""
        t0 = time.perf_counter()
        self._pass_threads = []
        cores = self._cores.describe() if self._cores is not None else None  # at the start
        adv_NG = BA.batch_advantages(groups, self.advantage_options)
        out = self._train_rows(rows_of(groups, adv_NG), t0)
        if self._cores is not None:
            self._cores.finished_step()  # idle until the next: the cores go to the producers
        return out | {"cores": cores}

    def _train_rows(self, rows: list[Row], t0: float) -> dict[str, Any]:
        """The step on rows whose advantages are set (a sharded learner's ranks enter here)."""
        updates = self.cfg.train.updates_per_batch
        old = self._old_logp(rows) if L.needs_old_logp_pass(updates) else None
        parts = [list(range(u, len(rows), updates)) for u in range(updates)]
        passes: list[tuple[dict[str, float], int, bool]] = []
        grad_norms = []
        lr = float(self.optimizer.param_groups[0]["lr"])  # this step's (first update's) lr
        for part in parts:
            part_passes, grad_norm = self._update([rows[i] for i in part], old, part)
            passes.extend(part_passes)
            grad_norms.append(grad_norm)
        metrics = self._all_metrics(passes)
        out: dict[str, Any] = SM.combine(metrics)
        positions, real = out.pop("forward_positions_sum"), out.pop("forward_real_sum")
        row_tokens, shared = out.pop("forward_tokens_sum"), out.pop("shared_prompt_passes_sum")
        out.pop("torch_threads_sum")
        # the mean over the step's units (each pass's start, each decoder layer's forward and
        # backward); every unit's threads in order, old-log-prob passes included: they change
        # the float rounding, so the stream records them for a replay
        units = self._pass_threads or [torch.get_num_threads()]
        out["learner_threads"] = sum(units) / len(units)
        out["pass_threads"] = list(self._pass_threads)
        out["tokens_kept_unknown"] = int(out.pop("tokens_kept_unknown_sum", 0))
        out["loss"] = out.pop("loss_sum", 0.0) / updates  # the mean update's full-batch loss
        out.update(
            attention=SM.layouts(self.attention.path, shared, len(metrics)),
            padding_frac=1.0 - real / max(positions, 1.0),
            positions_saved_frac=1.0 - real / max(row_tokens, 1.0),
            micro_batches=len(metrics),
        )
        if out.get("tis_weight_sq_sum"):  # effective sample size of the TIS weights, in (0, 1]
            out["tis_ess"] = out["tis_weight_sum"] ** 2 / (
                out["num_tokens"] * out["tis_weight_sq_sum"]
            )
        out.update(
            grad_norm=float(np.mean(grad_norms)),
            lr=lr,
            step_s=time.perf_counter() - t0,
        )
        return out

    def _update(
        self, rows: list[Row], old: dict[int, torch.Tensor] | None, row_ids: list[int]
    ) -> tuple[list[tuple[dict[str, float], int, bool]], float]:
        """Gradients of the loss over `rows` (normalised by all of them), one optimizer step;
        returns (metrics, completion tokens, real) per forward/backward pass, and the grad norm."""
        c = self.cfg
        global_tokens, global_seqs = loss_normalisers(rows)
        self.optimizer.zero_grad(set_to_none=True)
        passes = []
        for plan, real in self._micro_batches(rows, row_ids):
            threads = self._take_threads()
            mb = self._collate(rows, plan)
            old_BT = None if old is None else _stack_old(old, [row_ids[i] for i in plan], mb)
            with self._layer_threads():
                loss, m = self._micro_loss(
                    mb, old_BT, global_tokens=global_tokens, global_seqs=global_seqs
                )
                (loss if real else loss * 0.0).backward()  # type: ignore[no-untyped-call]
            m["forward_positions_sum"] = float(mb.num_positions)
            m["forward_real_sum"] = float(mb.num_real)
            m["forward_tokens_sum"] = float(sum(len(rows[i].ids) for i in plan))
            m["shared_prompt_passes_sum"] = float(mb.layout == "shared_prompt")
            m["torch_threads_sum"] = float(threads)
            passes.append((m, mb.num_tokens, real))
        clip = c.train.grad_clip if c.train.grad_clip > 0 else math.inf
        grad_norm = self._clip_grad_norm(clip)
        if self._weights_fence is not None:  # the weights change below: the copy goes first
            self._weights_fence.hold_stream()
            self._weights_fence = None
        self.optimizer.step()
        self.scheduler.step()
        return passes, grad_norm

    # -- what a sharded learner changes (consumer/train/sharded.py) ----------------------------
    def _micro_batches(self, rows: list[Row], row_ids: list[int]) -> list[tuple[list[int], bool]]:
        """The forward/backward passes over `rows` (indices into it) and whether each counts:
        here every row, each pass real. `row_ids` are the rows' indices in the whole batch."""
        return [(plan, True) for plan in self._plan(rows)]

    def _all_metrics(
        self, passes: list[tuple[dict[str, float], int, bool]]
    ) -> list[tuple[dict[str, float], int]]:
        """(metrics, completion tokens) of every real pass of the step."""
        return [(m, n) for m, n, real in passes if real]

    def _clip_grad_norm(self, clip: float) -> float:
        """Clip the gradients to a global norm of `clip`; the norm before clipping."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        return float(torch.nn.utils.clip_grad_norm_(params, clip))

    def eval_model(self) -> Any:
        """A model with the current weights that `generate` can run in this process alone."""
        return self.model

    def share_cores(self, seat: Share | None) -> None:
        """Take the threads `seat` gives before each pass (the core board, or a replay's record)."""
        self._cores = seat

    def _take_threads(self) -> int:
        """This pass's torch threads: the board's share, or as configured."""
        if self._cores is not None:
            threads = self._cores.work()
            if threads != torch.get_num_threads():
                torch.set_num_threads(threads)
        self._pass_threads.append(torch.get_num_threads())
        return self._pass_threads[-1]

    def _retake_threads(self) -> int:
        """A decoder layer's threads (layer_threads.py): as a pass's, none without a board."""
        if self._cores is None:
            return torch.get_num_threads()
        return self._take_threads()

    @property
    def threads_per_layer(self) -> bool:
        """True when the decoder layers take threads too (what a recording says of them)."""
        cores = self._cores
        return bool(self._layers and self._layers.layers and cores and cores.per_layer)

    def _layer_threads(self) -> contextlib.AbstractContextManager[None]:
        """Inside: the decoder layers take their threads (a CPU model with a board)."""
        if not self.threads_per_layer:
            return contextlib.nullcontext()
        assert self._layers is not None
        return self._layers.active()

    def idle(self) -> None:
        """Called while the learner waits for groups (nothing to do on one device)."""

    def close(self) -> None:
        """The run is over (nothing to release on one device)."""

    # ------------------------------------------------------------------------------------------
    def _plan(self, rows: list[Row]) -> list[list[int]]:
        budget = self.cfg.train.micro_batch_tokens
        if self.attention.shared_prompt and SP.worth_it(rows, self._shapes):
            return SP.plan(rows, budget)  # whole groups per micro-batch
        lengths = [len(r.ids) for r in rows]
        return plan_micro_batches(lengths, budget, packed=self.attention.packed)

    def _collate(self, rows: list[Row], plan: list[int]) -> MicroBatch:
        shared = (
            SP.layout_for([rows[i] for i in plan], self._shapes)
            if self.attention.shared_prompt
            else None
        )
        return collate(
            rows,
            plan,
            pad_id=self.pad_id,
            device=self.device,
            packed=self.attention.packed,
            shared_prompt=shared is not None,
            one_sequence=shared == "one",
        )

    def _forward_logp(
        self, policy: CompletionForward, mb: MicroBatch, *, with_entropy: bool = False
    ) -> tuple[torch.Tensor, HeadOut]:
        """(logp_BT in the loss frame, 0 off the mask; the head's per-token outputs)."""
        ctx = (
            torch.autocast("cuda", dtype=torch.bfloat16)
            if self._autocast
            else contextlib.nullcontext()
        )
        with ctx:
            out = policy(mb, with_entropy=with_entropy)
        logp_BT = out.logp_N.new_zeros(mb.mask_BT.shape).masked_scatter(mb.mask_BT, out.logp_N)
        return logp_BT, out

    def _micro_loss(
        self, mb: MicroBatch, old_BT: torch.Tensor | None, *, global_tokens: int, global_seqs: int
    ) -> tuple[torch.Tensor, dict[str, float]]:
        logp_BT, head = self._forward_logp(self.policy, mb, with_entropy=True)
        ref_BT = None
        if self.ref_policy is not None:
            with torch.no_grad(), self._reference():
                ref_BT, _ = self._forward_logp(self.ref_policy, mb)
        loss, metrics = L.policy_loss(
            logp_BT,
            logp_BT.detach() if old_BT is None else old_BT,
            mb.behavior_logp_BT,
            mb.advantages_B,
            mb.mask_BT,
            self.loss_options,
            ref_logp=ref_BT,
            global_tokens=global_tokens,
            global_seqs=global_seqs,
        )
        assert head.entropy_N is not None
        metrics["loss_sum"] = float(loss.detach())  # global normalisers: passes add up
        metrics["entropy"] = float(head.entropy_N.sum()) / max(mb.num_tokens, 1)
        metrics.update(SM.kept_metrics(mb, head, self.vocab_size))
        return loss, metrics

    def _reference(self) -> contextlib.AbstractContextManager[None]:
        """Inside: the reference policy's forward (LoRA: the adapter off, the base alone)."""
        return LA.disabled(self.model) if self.adapter else contextlib.nullcontext()

    @torch.no_grad()
    def _old_logp(self, rows: list[Row]) -> dict[int, torch.Tensor]:
        """Learner log-probs before any update of this batch, per row (completion positions)."""
        out: dict[int, torch.Tensor] = {}
        for plan, real in self._micro_batches(rows, list(range(len(rows)))):
            self._take_threads()
            mb = self._collate(rows, plan)
            with self._layer_threads():
                logp_BT, _ = self._forward_logp(self.policy, mb)
            for b, i in enumerate(plan):
                if real:
                    out[i] = logp_BT[b]
        return out

    # ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def logprobs(self, groups: list[Group]) -> list[np.ndarray]:
        """Learner log-probs of every completion's sampled tokens (one float32 array per
        completion, aligned with its behaviour log-probs; an episode's inserted tokens have
        none)."""
        rows = rows_of(groups, np.zeros((len(groups), groups[0].group_size)), all_episodes=True)
        per_row = self._old_logp(rows)
        return [
            per_row[i][r.prompt_len - 1 + r.sampled_positions()].float().cpu().numpy()
            for i, r in enumerate(rows)
        ]

    def weights(self) -> dict[str, torch.Tensor]:
        """The policy's live weights by HF name (tied names share a tensor), for publication;
        with LoRA the adapter's tensors only (consumer/train/adapter.py)."""
        return LA.tensors(self.model) if self.adapter else dict(self.model.state_dict())

    def hold_weights(self, fence: Fence) -> None:
        """Keep the weights as they are until `fence` (a copy of them) completes."""
        self._weights_fence = fence

    # -- checkpoints (the directory around them: consumer/train/checkpoint.py) ------------------
    def save_checkpoint(self, directory: Path, *, weights: SnapshotInfo | None = None) -> None:
        """`model.safetensors` (a link to `weights` if given; a LoRA run's adapter tensors only)
        and `trainer.pt` in `directory`."""
        checkpoint.save_plain(
            directory,
            self.model,
            self.optimizer,
            self.scheduler,
            published=weights,
            weights=LA.tensors(self.model) if self.adapter else None,
        )

    def load_checkpoint(self, directory: Path) -> None:
        """Restore from `directory`, written by one process or by a sharded learner's ranks."""
        if sharded_checkpoint.is_sharded(directory):  # every rank's shards, read by one
            sharded_checkpoint.load(self.model, self.optimizer, self.scheduler, directory, rank=0)
        else:
            checkpoint.load_plain(
                directory,
                self.model,
                self.optimizer,
                self.scheduler,
                device=self.device,
                restore=partial(LA.restore, self.model) if self.adapter else None,
            )


def use_deterministic_kernels() -> None:
    """Kernels that give the same bits every run (docs/replay.md): cuBLAS with a fixed
    workspace (read when its handle is made, so before the first matmul), no nondeterministic
    algorithm (torch raises where an op has none), cuDNN without autotuning."""
    import os

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def _stack_old(old: dict[int, torch.Tensor], ids: list[int], mb: MicroBatch) -> torch.Tensor:
    T = mb.mask_BT.shape[1]
    out = torch.zeros(len(ids), T, device=mb.mask_BT.device)
    for b, i in enumerate(ids):
        n = min(T, old[i].shape[0])
        out[b, :n] = old[i][:n]
    return out


def _pad_id(config: Any) -> int:
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, list):
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return 0

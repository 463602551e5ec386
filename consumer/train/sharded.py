"""The learner sharded over torchrun's ranks with FSDP2: one policy, steps equal to one process's.

What it owns: sharding the model (`torch.distributed.fsdp.fully_shard`), the data-parallel
split of each step, the orders that keep the other ranks in step with rank 0 (`follow`), the
full state dict gathered for publication and evaluation, and the checkpoint save/restore
orders (their format: consumer/train/sharded_checkpoint.py). What it does not do: sockets, leases,
metrics files, evaluation (rank 0's learner does all of that, consumer/learner.py).

Sharding: `fully_shard` on each decoder layer, then on the root, `CompletionForward` (the
decoder plus the chunked LM head, consumer/train/forward.py), which keeps the embeddings,
the final norm and the LM head (tied or not) in one group gathered in the root's own forward.
Parameters and AdamW state live sharded (fp32 DTensors, the master weights); with
`model.dtype = "bfloat16"` on CUDA they are gathered in bf16 for compute and gradients reduced
in `dist.reduce_dtype` (fp32 by default). The reference model (beta > 0) is sharded alike.

One step, N ranks (= one process on the whole batch, to float summation order):
- rank 0 computes the advantages and sends every rank the rows as tensors
  (consumer/train/ranks.py `share_rows`); `split_by_tokens` gives each rank its rows;
- the loss of every micro-batch is normalised by the whole batch's tokens and rows (the
  trainer's global normalisers), and gradients are summed across ranks, not averaged
  (`set_gradient_divide_factor(1)`), so the sum of the ranks' gradients is the full gradient;
- FSDP's gathers are collectives, so every rank makes the same number of forward/backward
  passes: a rank with fewer micro-batches runs padding passes (one of its rows, loss × 0)
  whose metrics are dropped;
- the gradient norm is global (clipping sees the whole gradient); per-pass metrics are
  gathered to rank 0 and combined there exactly as one process combines its micro-batches.

World size 1 never comes here: `make_trainer` (consumer/train/__init__.py) returns the
single-device `DeviceTrainer`.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from common.config import Config
from common.host.core_board import Share
from common.wire import Group, SnapshotInfo
from consumer.train import adapter as LA
from consumer.train import ranks as D
from consumer.train import sharded_checkpoint
from consumer.train import shared_prompt as SP
from consumer.train.batching import Row, split_by_tokens
from consumer.train.forward import CompletionForward
from consumer.train.trainer import DeviceTrainer

log = logging.getLogger("asyncgrpo.consumer")


def follow(cfg: Config, run_dir: Path, world: D.World) -> int:
    """Ranks > 0 of a sharded consumer: build this rank's part of the learner, then do what rank
    0 says until it ends the run (exit code 0). SIGINT and SIGTERM are ignored here: rank 0
    decides when the run ends and needs every rank for its final snapshot and checkpoint; if
    rank 0 dies, the next collective raises `RankFailure` instead."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    trainer = ShardedTrainer(cfg, Path(cfg.model.path), world)
    log.info(
        "rank %d of %d (pid %d) following rank 0 (run dir %s)",
        world.rank,
        world.size,
        os.getpid(),
        run_dir,
    )
    trainer.follow()
    log.info("rank %d: rank 0 ended the run", world.rank)
    return 0


class ShardedTrainer(DeviceTrainer):
    """The `Trainer` on one rank of several; rank 0 drives, the others `follow`."""

    def __init__(self, cfg: Config, model_dir: Path, world: D.World) -> None:
        from common.host.device import resolve_device

        self.world = world
        self.model_dir = model_dir
        cuda = resolve_device(cfg.model.device).type == "cuda"
        D.init(world, cuda=cuda, timeout_s=cfg.dist.timeout_s)
        self.channel = D.Channel(world, timeout_s=cfg.dist.timeout_s)
        self._owner: list[int] = []  # rank of each row of the current batch
        self._tied: dict[str, str] = {}  # alias -> first name of tensors the model shares
        self._gathered: tuple[int, dict[str, torch.Tensor]] | None = None
        self._eval_model: Any = None
        self._stopped = False
        super().__init__(cfg, model_dir)
        log.info("learner sharded: %s", self.sharding)

    @property
    def world_size(self) -> int:
        return self.world.size

    def _forward_module(self, model: Any) -> CompletionForward:
        if not self._tied:
            self._tied = _tie_aliases(model)
        policy = super()._forward_module(model)
        self.sharding = shard(policy, self.cfg, world=self.world)
        return policy

    # -- one step ------------------------------------------------------------------------------
    def step(self, groups: list[Group]) -> dict[str, Any]:
        self.channel.send(D.Op.STEP)
        return super().step(groups)

    def _train_rows(self, rows: list[Row], t0: float) -> dict[str, Any]:
        rows = D.share_rows(rows if self.world.main else None)
        if self.attention.shared_prompt:  # whole groups, so each keeps its prompt shared
            groups = list(dict.fromkeys(r.group for r in rows))
            owner = split_by_tokens(SP.group_lengths(rows), self.world.size)
            by_group = dict(zip(groups, owner, strict=True))
            self._owner = [by_group[r.group] for r in rows]
        else:
            self._owner = split_by_tokens([len(r.ids) for r in rows], self.world.size)
        with D.failures("a training step"):  # FSDP's gathers and reductions inside
            return super()._train_rows(rows, t0)

    def _micro_batches(self, rows: list[Row], row_ids: list[int]) -> list[tuple[list[int], bool]]:
        by_rank: list[list[int]] = [[] for _ in range(self.world.size)]
        for i, r in enumerate(row_ids):
            by_rank[self._owner[r]].append(i)
        counts = [len(self._plan([rows[i] for i in mine])) if mine else 0 for mine in by_rank]
        mine = by_rank[self.world.rank]
        plans = [[mine[j] for j in p] for p in self._plan([rows[i] for i in mine])] if mine else []
        padding = (mine[:1] or [0], False)  # any row: its loss is multiplied by 0
        return [(p, True) for p in plans] + [padding] * (max(counts) - len(plans))

    def _all_metrics(
        self, passes: list[tuple[dict[str, float], int, bool]]
    ) -> list[tuple[dict[str, float], int]]:
        gathered = D.gather_metrics(passes, self.world)
        return gathered if self.world.main else [(m, n) for m, n, _ in passes]

    def _clip_grad_norm(self, clip: float) -> float:
        with D.failures("the gradient norm"):
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
            if isinstance(norm, DTensor):
                norm = norm.full_tensor()
        return float(norm)

    def logprobs(self, groups: list[Group]) -> list[Any]:
        raise NotImplementedError("learner log-probs of groups are computed by one process")

    # -- the full weights, for rank 0 ----------------------------------------------------------
    def weights(self) -> dict[str, torch.Tensor]:
        """Rank 0: the full state dict on the CPU by HF name, tied names sharing a tensor as the
        single-device trainer's do (every rank joins the gather)."""
        step = self.scheduler.last_epoch
        if self._gathered is not None and self._gathered[0] == step:
            return self._gathered[1]  # already gathered at this step (publication, evaluation)
        self.channel.send(D.Op.GATHER)
        state = self._gather()
        self._gathered = (step, state)
        return state

    def _gather(self) -> dict[str, torch.Tensor]:
        if self.adapter:  # LoRA: the adapter's tensors only, each gathered in the same order
            with D.failures("gathering the adapter"):
                return {
                    name: (t.full_tensor() if isinstance(t, DTensor) else t).detach().cpu()
                    for name, t in LA.tensors(self.model).items()
                }
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        with D.failures("gathering the weights"):
            # full and offloaded: every value is a CPU tensor
            state = cast(dict[str, torch.Tensor], get_model_state_dict(self.model, options=options))
        for alias, name in self._tied.items():
            if name in state:
                state[alias] = state[name]
        return state

    def eval_model(self) -> Any:
        """Rank 0: a plain copy of the policy with the current weights (gathered)."""
        from transformers import AutoModelForCausalLM

        state = self.weights()
        if self._eval_model is None:
            self._eval_model = AutoModelForCausalLM.from_pretrained(
                self.model_dir, dtype=torch.float32
            ).to(self.device)  # type: ignore[arg-type]  # transformers' wrapped `to`
            if self.adapter:
                LA.attach(self._eval_model, self.cfg.model.lora, self.model_dir)
        if self.adapter:
            LA.restore(self._eval_model, state)
        else:
            self._eval_model.load_state_dict(state, strict=False)
        return self._eval_model

    # -- checkpoints ---------------------------------------------------------------------------
    def save_checkpoint(self, directory: Path, *, weights: SnapshotInfo | None = None) -> None:
        """Rank 0: every rank writes its shards into `directory` (sharded_checkpoint.py; a
        published file is not reused: the shards are what resumes at any world size)."""
        self.channel.send(D.Op.SAVE, str(directory))
        self._save(directory)

    def load_checkpoint(self, directory: Path) -> None:
        """Rank 0: every rank restores from `directory`, written by any world size."""
        self.channel.send(D.Op.LOAD, str(directory))
        self._restore(directory)

    def _save(self, directory: Path) -> None:
        with D.failures("saving a checkpoint"):
            sharded_checkpoint.save(
                self.model, self.optimizer, self.scheduler, directory, rank=self.world.rank
            )
        D.barrier()

    def _restore(self, directory: Path) -> None:
        with D.failures("restoring a checkpoint"):
            if sharded_checkpoint.is_sharded(directory):
                sharded_checkpoint.load(
                    self.model, self.optimizer, self.scheduler, directory, rank=self.world.rank
                )
            else:
                sharded_checkpoint.load_full(
                    self.model, self.optimizer, self.scheduler, directory, main=self.world.main
                )
        self._gathered = None

    def share_cores(self, seat: Share | None) -> None:
        """Not taken: every rank keeps the threads torchrun gave it (the ranks compute together,
        and only rank 0 is on the board)."""

    # -- the other ranks -----------------------------------------------------------------------
    def idle(self) -> None:
        if self.world.main:
            self.channel.keepalive()

    def close(self) -> None:
        """Rank 0: tell the other ranks the run is over (once)."""
        if self.world.main and not self._stopped:
            self._stopped = True
            self.channel.send(D.Op.STOP)

    def follow(self) -> None:
        """Ranks > 0: do what rank 0 says until it says STOP."""
        assert not self.world.main
        while True:
            op, text = self.channel.receive()
            if op is D.Op.STOP:
                return
            if op is D.Op.STEP:
                self._train_rows([], time.perf_counter())
            elif op is D.Op.GATHER:
                self._gather()
            elif op is D.Op.SAVE:
                self._save(Path(text))
            elif op is D.Op.LOAD:
                self._restore(Path(text))


def shard(policy: CompletionForward, cfg: Config, *, world: D.World) -> str:
    """`fully_shard` each decoder layer, then the root; gradients summed across ranks. Returns
    a one-line description for the log."""
    bf16 = cfg.model.dtype == "bfloat16" and next(policy.parameters()).device.type == "cuda"
    mp = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if bf16 else None,
        reduce_dtype=getattr(torch, cfg.dist.reduce_dtype) if bf16 else None,
    )
    layers = getattr(policy.model.get_decoder(), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"sharding: {type(policy.model).__name__} has no decoder layer list")
    numel = sum(p.numel() for p in policy.parameters())
    for layer in layers:
        fully_shard(layer, mp_policy=mp, reshard_after_forward=cfg.dist.reshard_after_forward)
    fully_shard(policy, mp_policy=mp, reshard_after_forward=False)  # backward needs it first
    for module in policy.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)  # sum: the loss is already globally normalised
            module.set_force_sum_reduction_for_comms(True)
    precision = f"bf16 compute, {cfg.dist.reduce_dtype} reduction" if bf16 else "float32 throughout"
    return (
        f"FSDP2 over {world.size} ranks, {len(layers)} decoder layers + root (embeddings, final "
        f"norm, LM head), {numel:,} parameters (~{numel // world.size:,} per rank, fp32 master "
        f"weights and AdamW state sharded), {precision}, reshard_after_forward="
        f"{cfg.dist.reshard_after_forward}"
    )


def _tie_aliases(model: Any) -> dict[str, str]:
    """{alias: first name} of state-dict entries that share storage (a tied LM head)."""
    first: dict[tuple[int, tuple[int, ...]], str] = {}
    out = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key in first:
            out[name] = first[key]
        else:
            first[key] = name
    return out

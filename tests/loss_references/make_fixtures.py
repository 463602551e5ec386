"""Write fixtures.json: the reference libraries' losses, gradients and advantages on the cases.

    python tests/loss_references/make_fixtures.py --verl-src DIR [--out PATH]

Calls TRL 1.16's `GRPOTrainer._compute_loss` (importance_sampling_level "sequence": GSPO; loss
type "cispo") on a stand-in trainer object that hands it the case's log-probs, and verl's
`compute_policy_loss_gspo`, `compute_policy_loss_geo_mean`, `compute_policy_loss_cispo` and its
GRPO, RLOO, REINFORCE++ and REINFORCE++-baseline advantage estimators, loaded from a verl source
tree (`DIR/verl/trainer/ppo/core_algos.py` and `DIR/verl/utils/torch_functional.py`, the files of
verl 0.8.0.dev, commit b178a3cd) with what they import and do not use stubbed. Gradients are
d loss / d logp of the [B, T] learner log-probs. Needs `trl==1.16.0` installed (the `bench`
extra); the tests that read the fixtures need neither library.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.loss_references import cases as C

HERE = Path(__file__).resolve().parent


# -- verl, loaded from its source files with its unused imports stubbed ---------------------------
class ActorConfig(dict):  # type: ignore[type-arg]
    """verl's actor config: attributes and `.get`, as its loss functions read them."""

    def __getattr__(self, name: str) -> Any:
        return self[name]


class AlgoConfig(dict):  # type: ignore[type-arg]
    def __getattr__(self, name: str) -> Any:
        return self[name]


def _stub(name: str, **attrs: Any) -> None:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module


def load_verl(src: Path) -> types.ModuleType:
    _stub("omegaconf", DictConfig=dict)
    _stub("tensordict", TensorDict=dict)
    _stub("verl", __path__=[])
    _stub("verl.utils", __path__=[], as_torch_index=None, group_mean_std=None)
    _stub("verl.utils.device", get_device_name=lambda: "cpu", get_torch_device=lambda: torch.cpu)
    _stub("verl.utils.import_utils", deprecated=lambda *_a, **_k: lambda f: f)
    _stub("verl.trainer", __path__=[])
    _stub("verl.trainer.config", AlgoConfig=AlgoConfig)
    _stub("verl.trainer.ppo", __path__=[])
    _stub("verl.workers", __path__=[])
    _stub("verl.workers.config", ActorConfig=ActorConfig)
    for name, rel in [
        ("verl.utils.torch_functional", "verl/utils/torch_functional.py"),
        ("verl.trainer.ppo.core_algos", "verl/trainer/ppo/core_algos.py"),
    ]:
        spec = importlib.util.spec_from_file_location(name, src / rel)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    sys.modules["verl.utils"].torch_functional = sys.modules["verl.utils.torch_functional"]  # type: ignore[attr-defined]
    return sys.modules["verl.trainer.ppo.core_algos"]


def verl_policy(core: types.ModuleType, case: dict[str, Any]) -> dict[str, Any]:
    x = C.policy_inputs(case["seed"], empty_row=case["empty_row"])
    logp = x["logp"].clone().requires_grad_(True)
    mask = x["mask"].to(torch.float64)
    adv = x["adv"][:, None].expand_as(logp) * mask
    lo, hi = case["clip"]
    config = ActorConfig(clip_ratio=lo, clip_ratio_low=lo, clip_ratio_high=hi, global_batch_info={})
    w = (
        None
        if case["tis"] is None
        else C.tis_weights(x["old"], x["behavior"], x["mask"], case["tis"])
    )
    fn = {
        "verl_gspo": core.compute_policy_loss_gspo,
        "verl_gmpo": core.compute_policy_loss_geo_mean,
        "verl_cispo": core.compute_policy_loss_cispo,
    }[case["ref"]]
    agg = case.get("agg", "seq-mean-token-mean")
    loss, _ = fn(x["old"], logp, adv, mask, agg, config, rollout_is_weights=w)
    loss.backward()
    return {"loss": float(loss.detach()), "grad": logp.grad.tolist()}


def verl_advantages(core: types.ModuleType, case: dict[str, Any]) -> dict[str, Any]:
    x = C.advantage_inputs(case["seed"], prefix=case["ref"] == "verl_rfpp")
    scores, mask, index = C.token_rewards(x["rewards"], x["tokens"])
    ref = case["ref"]
    if ref == "verl_grpo":
        adv, _ = core.compute_grpo_outcome_advantage(
            scores, mask, index.numpy(), norm_adv_by_std_in_grpo=case["norm_by_std"]
        )
    elif ref == "verl_rloo":
        adv, _ = core.compute_rloo_outcome_advantage(scores, mask, index.numpy())
    elif ref == "verl_rfpp_baseline":
        adv, _ = core.compute_reinforce_plus_plus_baseline_outcome_advantage(
            scores, mask, index.numpy()
        )
    else:
        adv, _ = core.compute_reinforce_plus_plus_outcome_advantage(
            scores, mask, config=AlgoConfig(gamma=1.0)
        )
    # one value per completion: its tokens' advantage (0 for a completion without tokens)
    per_row = [float(a[m > 0][0]) if (m > 0).any() else 0.0 for a, m in zip(adv, mask, strict=True)]
    return {"advantages": per_row}


# -- TRL 1.16's GRPOTrainer._compute_loss on a stand-in trainer -----------------------------------
class _Accelerator:
    num_processes = 1
    sync_gradients = True

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def reduce(self, x: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        return x


def trl_policy(case: dict[str, Any]) -> dict[str, Any]:
    from trl import GRPOTrainer

    x = C.policy_inputs(case["seed"], empty_row=case["empty_row"])
    B, T = x["mask"].shape
    logp = x["logp"].clone().requires_grad_(True)
    mask = x["mask"].to(torch.float64)
    if case["ref"] == "trl_gspo":
        loss_type, level = case["loss_type"], "sequence"
        eps_low, eps_high = case["clip"]
    else:
        loss_type, level = "cispo", case["level"]
        eps_low, eps_high = 0.2, case["epsilon_high"]  # CISPO reads epsilon_high only
    trainer = types.SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level=level,
        beta=case.get("beta", 0.0),
        args=types.SimpleNamespace(use_bias_correction_kl=False, delta=None),
        loss_type=loss_type,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        use_vllm=case["tis"] is not None,
        vllm_importance_sampling_correction=case["tis"] is not None,
        model=types.SimpleNamespace(training=False),
        max_completion_length=T,
        accelerator=_Accelerator(),
        _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        _metrics={"eval": defaultdict(list), "train": defaultdict(list)},
    )
    inputs: dict[str, Any] = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1, dtype=torch.long),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": mask,
        "advantages": x["adv"],
        "old_per_token_logps": x["old"],
        "ref_per_token_logps": x["ref"],
        "num_items_in_batch": mask.sum(),
    }
    if case["tis"] is not None:
        inputs["importance_sampling_ratio"] = C.tis_weights(
            x["old"], x["behavior"], x["mask"], case["tis"]
        )
    loss = GRPOTrainer._compute_loss(trainer, None, inputs)
    loss.backward()
    return {"loss": float(loss.detach()), "grad": logp.grad.tolist()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verl-src", type=Path, required=True, help="a verl source tree")
    parser.add_argument("--out", type=Path, default=HERE / "fixtures.json")
    args = parser.parse_args()
    import trl

    assert trl.__version__ == "1.16.0", trl.__version__
    torch.set_default_dtype(torch.float64)
    core = load_verl(args.verl_src)
    out: dict[str, Any] = {"trl": trl.__version__, "verl": "0.8.0.dev b178a3cd", "cases": {}}
    for case in C.all_cases():
        if case["ref"].startswith("trl_"):
            result = trl_policy(case)
        elif case["ref"] in C.POLICY_REFERENCES:
            result = verl_policy(core, case)
        else:
            result = verl_advantages(core, case)
        out["cases"][case["id"]] = result
    args.out.write_text(json.dumps(out, indent=None, separators=(",", ":")) + "\n")
    print(f"{len(out['cases'])} cases -> {args.out}")


if __name__ == "__main__":
    main()

"""The loss variants against the libraries that define them (float64, CPU).

tests/loss_references/fixtures.json holds what TRL 1.16 (`GRPOTrainer._compute_loss`: GSPO's
sequence-level ratio, CISPO) and verl (GSPO, geo_mean = GMPO, CISPO policy losses; GRPO, RLOO,
REINFORCE++ and REINFORCE++-baseline advantages) computed on seeded inputs, with d loss / d logp;
tests/loss_references/make_fixtures.py made it by calling them. Here only this project runs, on
the same inputs (tests/loss_references/cases.py), to 1e-6 relative.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from consumer.train import advantages as ADV
from consumer.train import loss as L
from tests.loss_references import cases as C

FIXTURES = json.loads(
    (Path(__file__).parents[1] / "loss_references" / "fixtures.json").read_text()
)["cases"]
CASES = C.all_cases()
POLICY = [c for c in CASES if c["ref"] in C.POLICY_REFERENCES]
ADVANTAGE = [c for c in CASES if c["ref"] in C.ADVANTAGE_REFERENCES]
RTOL = 1e-6


def close(ours: torch.Tensor, ref: torch.Tensor) -> None:
    torch.testing.assert_close(ours, ref, rtol=RTOL, atol=1e-12)


def test_every_case_has_its_reference_and_each_reference_enough_cases():
    assert sorted(FIXTURES) == sorted(c["id"] for c in CASES)
    for ref in C.POLICY_REFERENCES + C.ADVANTAGE_REFERENCES:
        assert sum(c["ref"] == ref for c in CASES) >= 20


def test_the_cases_cover_masks_unequal_lengths_and_empty_rows():
    masks = [C.policy_inputs(c["seed"], empty_row=c["empty_row"])["mask"] for c in POLICY]
    lengths = [m.sum(1) for m in masks]
    assert sum(bool((n == 0).any()) for n in lengths) >= 20  # empty rows
    assert all(len(set(n.tolist())) > 1 for n in lengths[:20])  # unequal lengths
    holes = [bool((m.int().diff(dim=1) == 1).sum() > (m.sum(1) > 0).sum()) for m in masks]
    assert sum(holes) >= 15  # a row whose mask has a hole (a token left out mid-row)


def _options(case: dict[str, Any], x: dict[str, torch.Tensor]) -> tuple[L.LossOptions, dict]:
    spec = C.ours(case, x)
    opts = dict(spec["options"])
    tis = opts.pop("tis")
    opts["tis"] = None if tis is None else L.TISConfig(tis[1], tis[0], C.TIS_CAP)
    return L.LossOptions(**opts), spec["kwargs"]


@pytest.mark.parametrize("case", POLICY, ids=[c["id"] for c in POLICY])
def test_policy_loss_and_gradient_equal_the_reference(case):
    x = C.policy_inputs(case["seed"], empty_row=case["empty_row"])
    options, kwargs = _options(case, x)
    logp = x["logp"].clone().requires_grad_(True)
    loss, _ = L.policy_loss(
        logp, x["old"], x["behavior"], x["adv"], x["mask"], options, ref_logp=x["ref"], **kwargs
    )
    loss.backward()
    ref = FIXTURES[case["id"]]
    close(loss.detach(), torch.tensor(ref["loss"], dtype=torch.float64))
    close(logp.grad, torch.tensor(ref["grad"], dtype=torch.float64))


@pytest.mark.parametrize("case", ADVANTAGE, ids=[c["id"] for c in ADVANTAGE])
def test_advantages_equal_the_reference(case):
    x = C.advantage_inputs(case["seed"], prefix=case["ref"] == "verl_rfpp")
    baseline, scale = {
        "verl_grpo": ("group", "group" if case.get("norm_by_std") else "none"),
        "verl_rloo": ("leave-one-out", "none"),
        "verl_rfpp_baseline": ("group-whiten", "none"),
        "verl_rfpp": ("batch-whiten", "none"),
    }[case["ref"]]
    adv = ADV.group_advantages(
        x["rewards"], baseline=baseline, scale=scale, eps=1e-6, tokens_NG=x["tokens"]
    )
    ref = torch.tensor(FIXTURES[case["id"]]["advantages"], dtype=torch.float64)
    has_tokens = x["tokens"].reshape(-1) > 0  # verl's advantage lives on tokens only
    close(adv.reshape(-1)[has_tokens], ref[has_tokens])

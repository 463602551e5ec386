"""`asyncgrpo stress --variant`: the GRPO family's variants as a dimension of a sweep."""

from __future__ import annotations

from pathlib import Path

import pytest

from common import config as C
from launch.stress import plan as P
from launch.stress.results import aggregate, is_sync_of
from launch.stress.verdict import verdict

DEMO = Path(__file__).parents[2] / "launch" / "configs" / "demo.toml"


def test_each_variant_is_compared_with_its_own_synchronous_setting():
    todo = P.settings([2, 0], [2], ["token-truncate"], [0], ("grpo", "gmpo"))
    assert [s.name for s in todo] == [
        "ms0-p2-token-truncate-s0-grpo",
        "ms2-p2-token-truncate-s0-grpo",
        "ms0-p2-token-truncate-s0-gmpo",
        "ms2-p2-token-truncate-s0-gmpo",
    ]
    assert todo[3].sync() == todo[2]
    assert todo[3].describe().endswith("IS token-truncate, loss gmpo")
    # the config's own loss keeps the names of sweeps from before variants
    assert P.Setting(0, 2, "off", 1).name == "ms0-p2-off-s1"


@pytest.mark.parametrize("variant", list(P.VARIANTS))
def test_every_variant_is_a_valid_config_of_the_demo(variant):
    base = C.load(DEMO, [])
    cfg = P.build_config(
        base,
        ms=4,
        is_mode="token-truncate",
        engine="hf",
        steps=10,
        sc=P.Scenario(),
        run_dir=Path("."),
        variant=variant,
    )
    C.validate(cfg)
    for key, value in P.variant_overrides(variant, base).items():
        section, name = key.split(".")
        assert getattr(getattr(cfg, section), name) == value


def test_dapos_window_is_the_last_fifth_of_the_completion_limit():
    base = C.load(DEMO, [])  # max_new_tokens 5
    assert P.variant_overrides("dapo", base)["loss.overlong_window"] == 1
    longer = C.override(base, {"sampling.max_new_tokens": 100})
    assert P.variant_overrides("dapo", longer)["loss.overlong_window"] == 20


def _row(variant, ms, seed, acc):
    return {
        "status": "ok",
        "variant": variant,
        "max_staleness": ms,
        "producers": 2,
        "is_mode": "token-truncate",
        "seed": seed,
        "final_accuracy": acc,
        "steps_per_hour": 100.0 * (1 + ms),
        "speedup_vs_sync": 1.0 + ms,
    }


def test_rows_aggregate_per_variant_and_pair_with_their_own_sync():
    rows = [
        _row(v, ms, s, 0.5 + 0.01 * s) for v in ("gmpo", "rloo") for ms in (0, 4) for s in (0, 1)
    ]
    aggs = aggregate(rows)
    assert [(a["variant"], a["max_staleness"], a["seeds"]) for a in aggs] == [
        ("gmpo", 0, 2),
        ("gmpo", 4, 2),
        ("rloo", 0, 2),
        ("rloo", 4, 2),
    ]
    assert is_sync_of(rows[0], rows[2])
    assert not is_sync_of(rows[4], rows[2])  # rloo's sync is not gmpo's
    lines = verdict(aggs, rows)
    assert any("loss gmpo" in line and "5.00×" in line for line in lines)
    old = {k: v for k, v in _row("config", 0, 0, 0.5).items() if k != "variant"}
    assert aggregate([old])[0]["variant"] == "config"  # rows of sweeps from before variants

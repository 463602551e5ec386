"""The learner and the replay train a batch through one piece of code (consumer/step.py): the
step's metrics line, its publication and its stream entry are built there, so a new metric is
one edit. What is left to each is where its batches come from and what ends their leases."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from common.files.metrics import StepRecord

CONSUMER = Path(__file__).resolve().parents[2] / "consumer"
KEYS = {f.name for f in dataclasses.fields(StepRecord)}


def literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }


def test_no_metrics_key_is_written_out_in_both_the_learner_and_the_replay():
    learner, replay = literals(CONSUMER / "learner.py"), literals(CONSUMER / "replay.py")
    assert not (learner & replay & KEYS)


def test_the_step_module_builds_the_metrics_line_the_stream_entry_and_the_publication():
    step = (CONSUMER / "step.py").read_text()
    assert {"reward_mean", "staleness_hist", "groups_trained", "publish_submit_s"} <= literals(
        CONSUMER / "step.py"
    )
    for name in ("learner.py", "replay.py"):
        text = (CONSUMER / name).read_text()
        assert "Steps(" in text
        for built_elsewhere in (
            "StepEntry(",
            "Publisher(",
            "JsonlWriter(",
            "publisher.submit(",
            "StepRecord(",
        ):
            assert built_elsewhere not in text, (name, built_elsewhere)
    assert all(
        piece in step for piece in ("StepEntry(", "Publisher(", "JsonlWriter(", "publisher.submit(")
    )

"""completions.jsonl on --resume: the rows of steps after the checkpoint, and a torn last line,
are dropped (atomically), the rest kept byte for byte."""

from __future__ import annotations

import json

from common.files import completions_file as CF


def row(step: int) -> CF.CompletionRow:
    return CF.CompletionRow(
        step=step, prompt_index=step, behavior_version=step - 1, prompt="1+1=", completion="2",
        reward=1.0, rewards={"exact_match": 1.0}, length=2, finish_reason="stop",
    )  # fmt: skip


def test_keep_through_drops_the_interrupted_timeline_and_a_torn_line(tmp_path):
    CF.append(tmp_path, [row(s) for s in (1, 1, 2, 3, 4, 5)])
    before = (tmp_path / CF.COMPLETIONS).read_bytes()
    with open(tmp_path / CF.COMPLETIONS, "a") as f:
        f.write(json.dumps(row(2).to_json())[:-7])  # killed mid-line
    assert CF.keep_through(tmp_path, 3) == 3  # steps 4 and 5, and the torn line
    assert [r.step for r in CF.read(tmp_path)] == [1, 1, 2, 3]
    kept = (tmp_path / CF.COMPLETIONS).read_bytes()
    assert before.startswith(kept)
    assert kept.endswith(b"\n")
    assert CF.keep_through(tmp_path, 3) == 0
    assert not list(tmp_path.glob("*.tmp"))


def test_keep_through_without_the_file_does_nothing(tmp_path):
    assert CF.keep_through(tmp_path, 7) == 0
    assert not (tmp_path / CF.COMPLETIONS).exists()

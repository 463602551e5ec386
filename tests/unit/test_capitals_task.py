"""The real-model example's task (docs/real_model/capitals.py): the JSONL files in the repository
are what the module writes, the held-out countries never appear in training, and the reward pays
a brief right answer only (whole words, aliases, accents, no second capital)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from common import config as C

EXAMPLE = Path(__file__).parents[2] / "docs" / "real_model"


@pytest.fixture
def capitals(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))  # what PYTHONPATH=docs/real_model does
    import capitals

    return capitals


def test_the_jsonl_files_are_what_the_module_writes(capitals, tmp_path: Path):
    capitals.main(tmp_path)
    for name in ("train.jsonl", "heldout.jsonl"):
        assert (tmp_path / name).read_text() == (EXAMPLE / name).read_text(), name


def test_the_split_is_disjoint_and_covers_the_table(capitals):
    train, held = capitals.split("train"), capitals.split("heldout")
    assert not {c for c, _ in train} & {c for c, _ in held}
    assert len(train) + len(held) == len(capitals.CAPITALS)
    assert len(held) >= 30
    assert len({c for c, _ in capitals.CAPITALS}) == len(capitals.CAPITALS)
    with pytest.raises(ValueError, match="split"):
        capitals.split("test")


def test_the_config_reads_these_files_with_the_chat_template():
    cfg = C.load(EXAMPLE / "smollm2.toml")
    assert cfg.task.prompt_format == "chat"
    assert cfg.task.path == str((EXAMPLE / "train.jsonl").resolve())
    assert cfg.eval.path == str((EXAMPLE / "heldout.jsonl").resolve())
    rows = [json.loads(line) for line in (EXAMPLE / "train.jsonl").read_text().splitlines()]
    assert set(rows[0]) == {cfg.task.prompt_field, cfg.task.answer_field}


@pytest.mark.parametrize(
    ("completion", "answer", "reward"),
    [
        ("Paris", "Paris", 1.0),
        ("The capital of France is Paris.", "Paris", 1.0),
        ("paris!", "Paris", 1.0),
        ("Kiev", "Kyiv|Kiev", 1.0),
        ("Brasília", "Brasilia", 1.0),  # accents do not matter
        ("Kuwait City", "Kuwait City", 1.0),  # "Kuwait" inside the right name is no second one
        ("Mexico City", "Mexico City", 1.0),
        ("Mexico", "Mexico City", 0.0),
        ("Romero", "Rome", 0.0),  # whole words only
        ("Paris, Berlin, Rome", "Paris", 0.0),  # a list of capitals is never paid
        ("Lyon", "Paris", 0.0),
        ("", "Paris", 0.0),
        ("The capital of France is", "Paris", 0.0),  # cut before the city
    ],
)
def test_the_reward(capitals, completion: str, answer: str, reward: float):
    assert capitals.capital(completion, answer) == reward

"""The user's rows: JSONL, Parquet (written here with pyarrow) and Hugging Face datasets (a
save_to_disk directory, local data files, a name in a local cache built here), each checked
row by row, with one error naming the file, the row and the field."""

from __future__ import annotations

import datetime
import glob
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common.config import Config, EvalConfig, TaskConfig
from common.errors import ConfigError
from common.wire import ChatTurn
from consumer.data.rows import PromptRow
from consumer.data.sources import data_format, heldout_rows, load_rows

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def task(path: Path | str, source: str = "jsonl", **changes: object) -> TaskConfig:
    return TaskConfig(source=source, path=str(path), **changes)  # type: ignore[arg-type]


def held_out(task: TaskConfig, path: Path | str, split: str = "test") -> Config:
    """A config whose held-out rows (`eval.path`) are read like `task`'s."""
    return Config(task=task, eval=EvalConfig(path=str(path), split=split))


def refusal(cfg: TaskConfig) -> str:
    with pytest.raises(ConfigError) as info:
        load_rows(cfg)
    return str(info.value)


# -- JSONL ---------------------------------------------------------------------------------------
def test_jsonl_rows_give_prompt_answer_and_every_other_column(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({"q": "1+1=", "a": 2, "unit": "cm", "tol": [0.5, 1]}) + "\n\n   \n"
        + json.dumps({"q": "2+2=", "a": "4"}) + "\n"
    )  # fmt: skip
    rows = load_rows(task(path, prompt_field="q", answer_field="a"))
    assert rows == [
        PromptRow("1+1=", "2", (), '{"unit":"cm","tol":[0.5,1]}'),
        PromptRow("2+2=", "4", (), ""),
    ]


def test_jsonl_keeps_unicode_line_separators_inside_strings(tmp_path):
    text = "first\u2028second\x85third\u2029"
    path = tmp_path / "p.jsonl"
    rows = [{"prompt": text, "answer": "x"}, {"prompt": "b", "answer": "y"}]
    path.write_text(
        "\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\r\n", encoding="utf-8"
    )
    assert [r.prompt for r in load_rows(task(path))] == [text, "b"]


def test_a_chat_prompt_becomes_messages_and_the_answer_may_be_absent(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"prompt": CHAT, "level": 3}])
    [row] = load_rows(task(path, answer_field=""))
    assert row == PromptRow(
        "", "", (ChatTurn("system", "Be brief."), ChatTurn("user", "2+2?")), '{"level":3}'
    )


@pytest.mark.parametrize(
    ("lines", "where", "why"),
    [
        (['{"prompt": "a", "answer": "b"}', "{not json"], "line 2", "not JSON"),
        (['{"prompt": "a", "answer": "b"}', "", '{"prompt": "a"}'], "line 3",
         "no field 'answer' (task.answer_field"),
        (['["prompt", "answer"]'], "line 1", "a row must be an object of named fields, not a list"),
        (['{"answer": "b", "x": 1}'], "line 1", "no field 'prompt' (task.prompt_field); the row "
         "has 'answer', 'x'"),
        (['{"prompt": 7, "answer": "b"}'], "line 1", "field 'prompt' is a int; a prompt is text"),
        (['{"prompt": "  ", "answer": "b"}'], "line 1", "field 'prompt' is empty"),
        (['{"prompt": [], "answer": "b"}'], "line 1", "field 'prompt' is empty"),
        (['{"prompt": [{"role": "user", "content": " "}], "answer": "b"}'], "line 1",
         "field 'prompt' is empty"),
        (['{"prompt": [{"role": "user"}], "answer": "b"}'], "line 1",
         "field 'prompt', message 0: a chat message is an object with a text 'role' and"),
        (['{"prompt": "a", "answer": null}'], "line 1", "field 'answer' is null; an answer is"),
        (['{"prompt": "a", "answer": [1]}'], "line 1", "field 'answer' is a list"),
        (['{"prompt": "a", "answer": "b", "completion": "x"}'], "line 1",
         "field 'completion' has the name of a reward argument"),
        (['{"prompt": "a", "answer": "b", "m": {"1": 2, "k": [{"z": 1}]}}', '{"prompt": "a", '
          '"answer": "b", "big": "' + "x" * 2000 + '"}'], "line 2",
         "the row takes 2.0 KiB, over task.max_row_kib = 1"),
    ],
)  # fmt: skip
def test_a_bad_jsonl_row_is_refused_naming_file_line_and_field(tmp_path, lines, where, why):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(lines) + "\n")
    message = refusal(task(path, max_row_kib=1.0))
    assert message.startswith(f"{path}: {where}: ")
    assert why in message


def test_a_line_that_is_not_utf8_or_a_missing_or_empty_file_is_refused(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"prompt": "a", "answer": "b"}\n{"prompt": "\xff", "answer": "b"}\n')
    assert refusal(task(path)).startswith(f"{path}: line 2: not UTF-8")
    assert refusal(task(tmp_path / "missing.jsonl")).startswith("task.path = ")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n \n")
    assert "holds no rows" in refusal(task(empty))


# -- Parquet -------------------------------------------------------------------------------------
def write_parquet(path: Path, columns: dict[str, list[object]]) -> Path:
    pq.write_table(pa.table(columns), path)
    return path


def test_parquet_rows_carry_lists_structs_dates_and_chat_prompts(tmp_path):
    path = write_parquet(tmp_path / "t.parquet", {
        "prompt": ["What is 2+2?", "Name a colour."],
        "answer": [4, 0.5],
        "tolerance": [0.5, None],
        "tags": [["a", "b"], []],
        "meta": [{"k": 1}, {"k": 2}],
        "day": [datetime.date(2026, 1, 2), datetime.date(2026, 1, 3)],
    })  # fmt: skip
    rows = load_rows(task(path, "parquet"))
    assert [(r.prompt, r.answer) for r in rows] == [("What is 2+2?", "4.0"), ("Name a colour.",
                                                                              "0.5")]  # fmt: skip
    assert json.loads(rows[0].columns) == {
        "tolerance": 0.5, "tags": ["a", "b"], "meta": {"k": 1}, "day": "2026-01-02"
    }  # fmt: skip
    assert json.loads(rows[1].columns)["tolerance"] is None
    chat = write_parquet(tmp_path / "c.parquet", {"prompt": [CHAT], "answer": ["4"]})
    assert load_rows(task(chat, "parquet"))[0].messages[1] == ChatTurn("user", "2+2?")


def test_a_bad_parquet_file_row_or_column_is_refused_naming_them(tmp_path):
    path = write_parquet(tmp_path / "t.parquet", {"question": ["a"], "answer": ["b"]})
    assert refusal(task(path, "parquet")) == (
        f"{path}: no column 'prompt' (task.prompt_field); its columns: 'question', 'answer'"
    )
    path = write_parquet(tmp_path / "e.parquet", {"prompt": ["a", "b", ""], "answer": ["1"] * 3})
    assert refusal(task(path, "parquet")) == (
        f"{path}: row 3: field 'prompt' is empty (a prompt needs text)"
    )
    path = write_parquet(tmp_path / "b.parquet", {"prompt": ["a"], "answer": ["1"], "raw": [b"x"]})
    assert refusal(task(path, "parquet")).startswith(f"{path}: row 1: field 'raw' holds a bytes")
    (tmp_path / "not.parquet").write_text("no")
    assert "not a readable Parquet file" in refusal(task(tmp_path / "not.parquet", "parquet"))


def test_without_the_data_extra_parquet_and_hf_say_what_to_install(tmp_path, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    missing = {"pyarrow", "datasets"}

    def spec(name: str, *args: object) -> object:
        return None if name in missing else find_spec(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", spec)
    path = write_parquet(tmp_path / "t.parquet", {"prompt": ["a"], "answer": ["b"]})
    assert refusal(task(path, "parquet")) == (
        "reading Parquet needs the pyarrow package: pip install 'asyncgrpo[data]'"
    )
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    assert refusal(task(tmp_path, "hf")) == (
        "reading a Hugging Face dataset needs the datasets package: pip install 'asyncgrpo[data]'"
    )
    assert {k: os.environ.get(k) for k in saved} == saved  # the offline flags were not left set


# -- Hugging Face datasets -----------------------------------------------------------------------
def test_a_save_to_disk_directory_is_read_whole_or_by_split(tmp_path):
    import datasets

    rows = {"prompt": ["p0", "p1"], "answer": ["0", "1"], "unit": ["cm", "m"]}
    datasets.Dataset.from_dict(rows).save_to_disk(tmp_path / "one")
    got = load_rows(task(tmp_path / "one", "hf"))
    assert [(r.prompt, r.columns) for r in got] == [("p0", '{"unit":"cm"}'), ("p1", '{"unit":"m"}')]
    splits = datasets.DatasetDict(
        train=datasets.Dataset.from_dict(rows), test=datasets.Dataset.from_dict({
            "prompt": ["t0"], "answer": ["9"], "unit": ["km"]})
    )  # fmt: skip
    splits.save_to_disk(tmp_path / "dict")
    cfg = task(tmp_path / "dict", "hf")
    assert [r.prompt for r in load_rows(cfg)] == ["p0", "p1"]
    assert [r.prompt for r in heldout_rows(held_out(cfg, tmp_path / "dict"))] == ["t0"]
    message = refusal(task(tmp_path / "dict", "hf", split="validation"))
    assert "has no split 'validation' (task.split); its splits: 'train', 'test'" in message


def test_local_data_files_load_through_the_datasets_library(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a", "answer": "1", "n": 5}])
    assert load_rows(task(tmp_path / "d.jsonl", "hf"))[0].columns == '{"n":5}'
    write_parquet(tmp_path / "d.parquet", {"prompt": ["b"], "answer": ["2"]})
    assert load_rows(task(tmp_path / "d.parquet", "hf"))[0].prompt == "b"
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "train.jsonl", [{"prompt": "c", "answer": "3"}])
    assert load_rows(task(tmp_path / "data", "hf"))[0].prompt == "c"
    (tmp_path / "x.xml").write_text("<a/>")
    assert "reads files ending in .jsonl" in refusal(task(tmp_path / "x.xml", "hf"))


def test_a_dataset_name_is_read_from_the_local_cache_offline(tmp_path, monkeypatch):
    import datasets
    import huggingface_hub.constants as hub

    cache = tmp_path / "cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"p{i}", "answer": str(i)} for i in range(3)])
    cache_as_the_hub_would(tmp_path / "d.jsonl", cache, "someone/toy")
    rows = heldout_rows(held_out(task("someone/toy", "hf"), "someone/toy", split="test"))
    assert [r.prompt for r in rows] == ["p0", "p1", "p2"]
    # the load was offline; the settings it changed are back as they were
    assert (datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE) == (False, False)
    assert "HF_HUB_OFFLINE" not in os.environ
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a name not cached: refused, not downloaded
    message = refusal(task("someone/absent", "hf"))
    assert message.startswith("task.path = 'someone/absent': could not load it as in the local")
    assert message.endswith(" (HF_HUB_OFFLINE=1)")
    assert "(nothing is downloaded)" in message


def test_a_dataset_name_not_cached_is_downloaded_once_saying_so(tmp_path, monkeypatch, capfd):
    import datasets

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    rows = {"prompt": ["p0"], "answer": ["0"]}
    hub = datasets.DatasetDict(train=datasets.Dataset.from_dict(rows))
    online: list[str] = []

    def load_dataset(name, config=None, **kwargs):  # the Hub, faked (no network here)
        if datasets.config.HF_HUB_OFFLINE:  # the offline read: not in the cache yet
            raise FileNotFoundError(f"Couldn't find a dataset script for {name}")
        online.append(name)
        return hub

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    assert [r.prompt for r in load_rows(task("someone/toy", "hf"))] == ["p0"]
    assert online == ["someone/toy"]
    said = capfd.readouterr().err
    assert "downloading the dataset someone/toy from the Hugging Face Hub into " in said

    def down(name, config=None, **kwargs):
        if datasets.config.HF_HUB_OFFLINE:
            raise FileNotFoundError("not cached")
        raise ConnectionError("Couldn't reach 'someone/gone' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", down)
    assert refusal(task("someone/gone", "hf")) == (
        "task.path = 'someone/gone': not in the local Hugging Face cache, and downloading it "
        "from the Hub failed: ConnectionError: Couldn't reach 'someone/gone' on the Hub "
        "(LocalEntryNotFoundError)"
    )


def cache_as_the_hub_would(data: Path, cache: Path, name: str) -> None:
    """`name` in the datasets cache as a download from the Hub leaves it (`namespace___name/
    default/VERSION/HASH/NAME-SPLIT.arrow`), built from a local file (no network here)."""
    import datasets

    files = {"train": str(data), "test": str(data)}
    datasets.load_dataset("json", data_files=files, cache_dir=str(cache))
    owner, short = name.split("/")
    target = cache / f"{owner}___{short}"
    (cache / "json").rename(target)
    [config] = glob.glob(str(target / "default-*"))
    os.rename(config, target / "default")
    for arrow in glob.glob(str(target / "default" / "*" / "*" / "json-*.arrow")):
        os.rename(arrow, arrow.replace("/json-", f"/{short}-"))


# -- held-out rows -------------------------------------------------------------------------------
def test_eval_path_is_read_like_task_path_or_by_its_suffix_for_the_synthetic_task(tmp_path):
    write_parquet(tmp_path / "e.parquet", {"prompt": ["a"], "answer": ["1"]})
    write_jsonl(tmp_path / "e.jsonl", [{"prompt": "b", "answer": "2"}])
    synthetic = TaskConfig()
    assert data_format(synthetic, str(tmp_path / "e.parquet")) == "parquet"
    assert heldout_rows(held_out(synthetic, tmp_path / "e.parquet"))[0].prompt == "a"
    assert data_format(synthetic, str(tmp_path / "e.jsonl")) == "jsonl"
    assert heldout_rows(held_out(synthetic, tmp_path / "e.jsonl"))[0].prompt == "b"
    parquet = task(tmp_path / "e.parquet", "parquet")
    assert heldout_rows(held_out(parquet, tmp_path / "e.parquet"))[0].prompt == "a"
    with pytest.raises(ConfigError) as info:
        heldout_rows(held_out(synthetic, tmp_path / "none.jsonl"))
    assert str(info.value).startswith("eval.path = ")

"""The user's prompt rows, read from disk and checked: JSONL, Parquet, Hugging Face datasets.

`load_rows(task, held_out=False)` reads `task.path` (or `task.eval_path`) whole and checks
every row (consumer/data/rows.py), so bad data stops the consumer at start with one
`ConfigError` that names the file, the row and the field, not a producer halfway through a run.
Rows are numbered from 1 in file order (JSONL: the line number, blank lines counted).
`eval_rows(cfg)`: the held-out prompts of evaluation during training (`[eval]`): the first
`eval.max_prompts` rows of `eval.path` (else `task.eval_path`), read as `task.eval_path` is,
else of the synthetic task's held-out split.

Formats (`task.source`; for `task.eval_path` the same, except that with `source = "synthetic"`
a path ending in `.parquet` is Parquet and anything else JSONL):
- `jsonl`: one JSON object per line (split at b"\\n" only: JSON allows U+2028 and friends
  unescaped inside strings);
- `parquet`: one file, read with pyarrow (list, struct and timestamp columns become Python
  lists, dicts and datetimes);
- `hf`: the `datasets` library, and never the network (offline for the load, whatever the
  environment says): a directory written by `save_to_disk` (a `Dataset`, or a `DatasetDict`
  whose split is `task.split` / `task.eval_split`), a local data file (`.jsonl`, `.json`,
  `.csv`, `.parquet`, `.arrow`, `.txt`) or directory of them (`load_dataset(path)`), or a
  dataset name already in the local Hugging Face cache (`load_dataset(name, task.hf_config,
  split=...)`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common.config import Config, TaskConfig
from common.errors import ConfigError
from consumer.data.rows import PromptRow, RowFields, row_of

HF_BUILDERS = {  # a local data file's suffix -> the `datasets` builder that reads it
    ".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet",
    ".arrow": "arrow", ".txt": "text",
}  # fmt: skip
_SAVED = ("dataset_info.json", "state.json", "dataset_dict.json")  # what save_to_disk writes


def data_format(task: TaskConfig, *, held_out: bool = False) -> str:
    """How `task.path` (or `task.eval_path`) is read: jsonl, parquet or hf."""
    if task.source != "synthetic":
        return task.source
    assert held_out, "the synthetic task has no data file"
    return "parquet" if task.eval_path.endswith(".parquet") else "jsonl"


def load_rows(task: TaskConfig, *, held_out: bool = False, key: str = "") -> list[PromptRow]:
    """Every row of `task.path` (`held_out`: `task.eval_path`), checked; `ConfigError` naming the
    file, row and field of the first bad one."""
    key = key or ("task.eval_path" if held_out else "task.path")  # the key errors name
    path = task.eval_path if held_out else task.path
    split = task.eval_split if held_out else task.split
    fields = RowFields(task.prompt_field, task.answer_field, int(task.max_row_kib * 1024))
    fmt = data_format(task, held_out=held_out)
    if fmt == "jsonl":
        records = _jsonl(Path(path), key)
    elif fmt == "parquet":
        records = _parquet(Path(path), key, fields)
    else:
        records = _hf(path, key, fields, config=task.hf_config, split=split)
    rows = [row_of(record, where, fields) for where, record in records]
    if not rows:
        raise ConfigError(f"{key} = {path!r} holds no rows")
    return rows


def eval_rows(cfg: Config) -> list[PromptRow]:
    """The held-out rows evaluation during training leases (module docstring)."""
    n = cfg.eval.max_prompts
    if cfg.eval.path or cfg.task.eval_path:
        task = dataclasses.replace(cfg.task, eval_path=cfg.eval.path or cfg.task.eval_path)
        key = "eval.path" if cfg.eval.path else "task.eval_path"
        return load_rows(task, held_out=True, key=key)[:n]
    assert cfg.task.source == "synthetic", "config validation asks for eval.path"
    from common.task.synthetic import make_examples

    return [PromptRow(ex.prompt, ex.answer) for ex in make_examples("heldout", n, seed=0)]


def _jsonl(path: Path, key: str) -> Iterator[tuple[str, Any]]:
    try:
        lines = path.read_bytes().split(b"\n")
    except OSError as exc:
        raise ConfigError(f"{key} = {str(path)!r}: {exc}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}: line {number}"
        try:
            record = json.loads(line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{where}: not UTF-8 ({exc})") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: not JSON ({exc})") from None
        yield where, record


def _parquet(path: Path, key: str, fields: RowFields) -> Iterator[tuple[str, Any]]:
    _need_module("pyarrow", "Parquet")
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise ConfigError(f"{key} = {str(path)!r}: not a readable Parquet file ({exc})") from None
    _need_columns(table.column_names, str(path), fields)
    for number, record in enumerate(table.to_pylist(), start=1):
        yield f"{path}: row {number}", record


def _need_columns(names: list[str], label: str, fields: RowFields) -> None:
    """A table's missing prompt or answer column, as one error for the whole file."""
    for field, key in ((fields.prompt_field, "prompt"), (fields.answer_field, "answer")):
        if field and field not in names:
            extra = "; set it to '' if the task has no answer" if key == "answer" else ""
            raise ConfigError(
                f"{label}: no column {field!r} (task.{key}_field{extra}); its columns: "
                f"{', '.join(map(repr, names)) or 'none'}"
            )


def _hf(
    path: str, key: str, fields: RowFields, *, config: str, split: str
) -> Iterator[tuple[str, Any]]:
    with _offline() as datasets:
        data = _hf_load(datasets, path, key, config=config, split=split)
        label = f"{path} [{split}]" if isinstance(data, dict) else path
        if isinstance(data, dict):  # a DatasetDict
            if split not in data:
                which = "task.eval_split" if key == "task.eval_path" else "task.split"
                raise ConfigError(
                    f"{key} = {path!r} has no split {split!r} ({which}); its splits: "
                    f"{', '.join(map(repr, data))}"
                )
            data = data[split]
        _need_columns(list(data.column_names), label, fields)
        records = data.to_list()
    for number, record in enumerate(records, start=1):
        yield f"{label}: row {number}", record


def _hf_load(datasets: Any, path: str, key: str, *, config: str, split: str) -> Any:
    """A `Dataset` or `DatasetDict` of `path` (see the module doc); `ConfigError` if none."""
    local = Path(path)
    try:
        if local.is_dir() and any((local / name).exists() for name in _SAVED):
            return datasets.load_from_disk(str(local))
        if local.is_file():
            builder = HF_BUILDERS.get(local.suffix)
            if builder is None:
                raise ConfigError(
                    f"{key} = {path!r}: source = 'hf' reads files ending in "
                    f"{', '.join(HF_BUILDERS)}, or a directory, or a cached dataset's name"
                )
            return datasets.load_dataset(builder, data_files=str(local), split="train")
        return datasets.load_dataset(path, config or None)  # every split: named in errors
    except ConfigError:
        raise
    except Exception as exc:  # datasets raises many kinds (FileNotFoundError, ConnectionError, ...)
        where = "a local file or directory" if local.exists() else "in the local Hugging Face cache"
        raise ConfigError(
            f"{key} = {path!r}: could not load it as {where} (nothing is downloaded): "
            f"{type(exc).__name__}: {_first_line(exc)}"
        ) from None


@contextlib.contextmanager
def _offline() -> Iterator[Any]:
    """The `datasets` module, with the Hugging Face Hub off (env and the modules' constants,
    which they read at import) and progress bars quiet; all put back afterwards."""
    _need_module("datasets", "a Hugging Face dataset")
    names = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    saved_env = {name: os.environ.get(name) for name in names}
    os.environ.update(dict.fromkeys(names, "1"))
    import datasets
    import huggingface_hub.constants as hub

    saved = (datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE)
    bars = datasets.is_progress_bar_enabled()
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = True
    datasets.disable_progress_bars()
    try:
        yield datasets
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = saved
        if bars:
            datasets.enable_progress_bars()
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _need_module(name: str, what: str) -> None:
    """A clear error when the optional `data` extra is not installed."""
    import importlib.util

    if importlib.util.find_spec(name) is None:
        raise ConfigError(f"reading {what} needs the {name} package: pip install 'asyncgrpo[data]'")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""

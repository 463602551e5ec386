"""The user's prompt rows, read from disk and checked: JSONL, Parquet, Hugging Face datasets.

`load_rows(task)` reads `task.path` whole and `heldout_rows(cfg)` `eval.path` (read as
`task.path` is, with the task's fields), each checking every row (consumer/data/rows.py), so bad
data stops the consumer at start with one `ConfigError` that names the file, the row and the
field, not a producer halfway through a run. Rows are numbered from 1 in file order (JSONL: the
line number, blank lines counted). `round_rows(cfg)`: the held-out prompts of evaluation during
training through the producers: the first `eval.max_prompts` rows of `eval.path`, else of the
synthetic task's held-out split.

Formats (`task.source`; for `eval.path` the same, except that with `source = "synthetic"` a path
ending in `.parquet` is Parquet and anything else JSONL):
- `jsonl`: one JSON object per line (split at b"\\n" only: JSON allows U+2028 and friends
  unescaped inside strings);
- `parquet`: one file, read with pyarrow (list, struct and timestamp columns become Python
  lists, dicts and datetimes);
- `hf`: the `datasets` library: a directory written by `save_to_disk` (a `Dataset`, or a
  `DatasetDict` whose split is `task.split` / `eval.split`), a local data file (`.jsonl`,
  `.json`, `.csv`, `.parquet`, `.arrow`, `.txt`) or directory of them (`load_dataset(path)`),
  or a dataset name (`ORG/NAME`, `load_dataset(name, task.hf_config)`). Everything is read
  offline first (whatever the environment says); a name not in the local Hugging Face cache is
  downloaded into it once, saying so (and every 10 s how long it has taken) besides the
  library's progress bars, unless `HF_HUB_OFFLINE=1` keeps this host offline.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from common.config import Config, TaskConfig
from common.errors import ConfigError, first_line
from consumer.data.rows import PromptRow, RowFields, row_of

HF_BUILDERS = {  # a local data file's suffix -> the `datasets` builder that reads it
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".txt": "text",
}
_SAVED = ("dataset_info.json", "state.json", "dataset_dict.json")  # what save_to_disk writes


def data_format(task: TaskConfig, path: str = "") -> str:
    """How `task.path` (or held-out rows at `path`) is read: jsonl, parquet or hf."""
    if task.source != "synthetic":
        return task.source
    assert path, "the synthetic task has no data file"
    return "parquet" if path.endswith(".parquet") else "jsonl"


def load_rows(task: TaskConfig) -> list[PromptRow]:
    """Every row of `task.path`, checked; `ConfigError` naming the file, row and field of the
    first bad one."""
    return _read(task, task.path, task.split, key="task.path", fmt=data_format(task))


def heldout_rows(cfg: Config) -> list[PromptRow]:
    """Every row of `eval.path`, read like `task.path` (its split `eval.split`), checked."""
    path = cfg.eval.path
    return _read(cfg.task, path, cfg.eval.split, key="eval.path", fmt=data_format(cfg.task, path))


def round_rows(cfg: Config) -> list[PromptRow]:
    """The held-out rows evaluation during training leases (module docstring)."""
    n = cfg.eval.max_prompts
    if cfg.eval.path:
        return heldout_rows(cfg)[:n]
    assert cfg.task.source == "synthetic", "config validation asks for eval.path"
    from common.task.synthetic import make_examples

    return [PromptRow(ex.prompt, ex.answer) for ex in make_examples("heldout", n, seed=0)]


def _read(task: TaskConfig, path: str, split: str, *, key: str, fmt: str) -> list[PromptRow]:
    fields = RowFields(task.prompt_field, task.answer_field, int(task.max_row_kib * 1024))
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
    data = _hf_data(path, key, config=config)
    label = f"{path} [{split}]" if isinstance(data, dict) else path
    if isinstance(data, dict):  # a DatasetDict
        if split not in data:
            which = "eval.split" if key == "eval.path" else "task.split"
            raise ConfigError(
                f"{key} = {path!r} has no split {split!r} ({which}); its splits: "
                f"{', '.join(map(repr, data))}"
            )
        data = data[split]
    _need_columns(list(data.column_names), label, fields)
    records = data.to_list()
    for number, record in enumerate(records, start=1):
        yield f"{label}: row {number}", record


def _hf_data(path: str, key: str, *, config: str) -> Any:
    """A `Dataset` or `DatasetDict` of `path`: read offline, else a name downloaded from the
    Hub (see the module doc); `ConfigError` if neither."""
    from common.host.model_dir import hub_offline, is_hub_name

    offline = hub_offline()  # as the user's environment says (`_offline` sets it meanwhile)
    with _offline() as datasets:
        try:
            return _hf_load(datasets, path, key, config=config)
        except ConfigError as exc:
            if Path(path).exists() or not is_hub_name(path):
                raise
            if offline:
                raise ConfigError(f"{exc} (HF_HUB_OFFLINE=1)") from None
    return _download(path, key, config=config)


def _download(name: str, key: str, *, config: str) -> Any:
    """Dataset `name` from the Hugging Face Hub into the local cache (every split)."""
    import sys

    import datasets

    from common.progress import heartbeat

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    say(
        f"downloading the dataset {name} from the Hugging Face Hub into "
        f"{datasets.config.HF_DATASETS_CACHE} (once; HF_HUB_OFFLINE=1 keeps this host offline)"
    )
    import huggingface_hub.constants as hub

    saved = (datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE)  # read at import: online now
    datasets.config.HF_HUB_OFFLINE = hub.HF_HUB_OFFLINE = False
    try:
        with heartbeat(f"downloading the dataset {name}", say):
            return datasets.load_dataset(name, config or None)
    except Exception as exc:  # datasets raises many kinds (HTTP, OS, builder errors)
        raise ConfigError(
            f"{key} = {name!r}: not in the local Hugging Face cache, and downloading it from the "
            f"Hub failed: {type(exc).__name__}: {first_line(exc)}"
        ) from None
    finally:
        datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE = saved


def _hf_load(datasets: Any, path: str, key: str, *, config: str) -> Any:
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
            f"{type(exc).__name__}: {first_line(exc)}"
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

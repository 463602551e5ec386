"""Reading, overriding and writing a `Config`: TOML files, `--set` text, typed values.

Values come from, in order: defaults, a TOML file (`load`), `--set section.key=value` text
(`apply_overrides`, parsed as TOML), then typed values from code and command-line flags
(`override`, no text in between). Every value is checked against its field's type and choices
as it arrives (an unknown key gets a suggestion); `load` then checks the whole (`validate`).
`load_given` also says which keys the user gave, so no caller reads the file again to learn it.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import tomli_w

from common.config.fields import choices
from common.config.tree import Config, _section_types, validate
from common.errors import ConfigError

# Keys that moved (old -> new): read as the new key with one deprecation line; given with the
# new one as well and a different value, refused. A run's config.toml written before the move
# holds them all (at their defaults, mostly), so `--resume` and `asyncgrpo eval` keep working.
MOVED = {
    "train.eval_every": "eval.learner_every_steps",
    "train.eval_size": "eval.learner_prompts",
    "task.eval_path": "eval.path",
    "task.eval_split": "eval.split",
    "task.eval_mode": "eval.mode",
}
log = logging.getLogger("asyncgrpo.config")


class Loaded(NamedTuple):
    """A loaded config and the `section.key` names the user gave: in the file (not a fallback
    file), in the `--set` text and in the typed values."""

    config: Config
    given: frozenset[str]


def from_dict(data: dict[str, Any], base: Config | None = None) -> Config:
    """Merge a nested dict (TOML layout) over `base` (defaults). Unknown keys are errors."""
    base = base or Config()
    sections = _section_types()
    updates = {}
    for name, values in _moved(data).items():
        if name not in sections:
            raise ConfigError(f"unknown section [{name}]{_suggest(name, sections)}")
        if not isinstance(values, dict):
            raise ConfigError(f"[{name}] must be a table")
        updates[name] = _merged(getattr(base, name), values, name)
    return dataclasses.replace(base, **updates)


def _merged(current: Any, values: dict[str, Any], where: str) -> Any:
    """The section (or nested table: `[model.lora]`) `current` with `values` over it: a
    nested table given as a TOML table changes only the keys it names."""
    changes = {}
    for k, v in values.items():
        inner = getattr(current, k, None)
        if dataclasses.is_dataclass(inner) and isinstance(v, dict) and k in _names(current):
            changes[k] = _merged(inner, v, f"{where}.{k}")
        else:
            changes[k] = _coerce(type(current), k, v, f"{where}.{k}")
    return dataclasses.replace(current, **changes)


def _names(section: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(section)}


def _nested(path: str, value: Any) -> Any:
    """`"lora.rank", 8` -> `{"lora": {"rank": 8}}` (a key inside a nested table)."""
    for part in reversed(path.split(".")[1:]):
        value = {part: value}
    return {path.split(".")[0]: value}


def _field_type(section_cls: type[Any], path: str) -> Any:
    """The type of `path` (`rank`, or `lora.rank` inside a nested table); None if unknown."""
    tp: Any = section_cls
    for part in path.split("."):
        if not (isinstance(tp, type) and dataclasses.is_dataclass(tp)):
            return None
        tp = typing.get_type_hints(tp).get(part)
    return tp


def _moved(data: dict[str, Any]) -> dict[str, Any]:
    """`data` (TOML layout) with the keys of `MOVED` under their new names, with a deprecation
    line for each (a value equal to its default says nothing: it is dropped); a `ConfigError`
    when the new key is given too, with another value that is not its default either."""
    if not any(f"{s}.{k}" in MOVED for s, t in data.items() if isinstance(t, dict) for k in t):
        return data
    out = {s: dict(t) if isinstance(t, dict) else t for s, t in data.items()}
    defaults = dataclasses.asdict(Config())
    for old, new in MOVED.items():
        section, key = old.split(".")
        new_section, new_key = new.split(".")
        table, target = out.get(section), out.setdefault(new_section, {})
        if not isinstance(table, dict) or key not in table or not isinstance(target, dict):
            continue  # absent, or a section given as something else: from_dict says so
        value, default = table.pop(key), defaults[new_section][new_key]
        if value == default:
            continue  # e.g. a whole config.toml written before the move
        if target.get(new_key, default) not in (default, value):
            raise ConfigError(
                f"{old} is now {new}: give only {new} (both are set, to {value!r} and "
                f"{target[new_key]!r})"
            )
        log.warning("%s is now %s: read as %s = %r (rename it)", old, new, new, value)
        target[new_key] = value
    return out


def load(
    path: str | Path | None,
    overrides: Iterable[str] = (),
    values: Mapping[str, object] | None = None,
) -> Config:
    """Defaults, then the TOML file (if any), then `section.key=value` text overrides, then
    typed `values` (`override`); validated."""
    return load_given(path, overrides, values).config


def load_given(
    path: str | Path | None,
    overrides: Iterable[str] = (),
    values: Mapping[str, object] | None = None,
    *,
    fallback: str | Path | None = None,
) -> Loaded:
    """`load`, and the keys the user gave. `fallback` is the file read when `path` is not
    given (`asyncgrpo launch`'s built-in demo config): its keys are defaults, not given."""
    cfg, given = Config(), set[str]()
    file = path or fallback
    if file:
        data = _read_toml(file)
        cfg = _absolute(from_dict(data, cfg), Path(file).parent)
        if path:
            given |= {
                MOVED.get(f"{section}.{key}", f"{section}.{key}")
                for section, table in data.items()
                for key in table
            }
    overrides = list(overrides)
    cfg = apply_overrides(cfg, overrides)
    given |= {_key(item.partition("=")[0]) for item in overrides}
    cfg = _absolute(override(cfg, values or {}), Path.cwd())
    given |= {_key(k) for k in values or {}}
    validate(cfg)
    return Loaded(cfg, frozenset(given))


# Keys naming a file or directory: relative in a config file, against that file's directory;
# given on the command line (--set, flags), against the current directory. Either way the
# loaded config holds them absolute, so a config written into a run directory means the same.
FILE_KEYS = (
    "task.path",
    "eval.path",
    "net.keys_dir",
    "net.connect_file",
)


def _key(key: str) -> str:
    """`section.key` as it is named now (`MOVED`)."""
    key = key.strip()
    return MOVED.get(key, key)


def _absolute(cfg: Config, base: Path) -> Config:
    """`cfg` with the relative `FILE_KEYS` made absolute against `base`."""
    values = {}
    for key in FILE_KEYS:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value and not Path(value).is_absolute():
            values[key] = os.path.abspath(base / value)
    return override(cfg, values) if values else cfg


def _read_toml(path: str | Path) -> dict[str, Any]:
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None


def override(cfg: Config, values: Mapping[str, object]) -> Config:
    """`cfg` with `{"section.key": value}` replaced, typed: the values are Python values (paths
    become strings), checked like a TOML file's (type, choices, unknown keys), never turned into
    text and parsed back. Not validated as a whole (`validate` does that)."""
    for key, value in values.items():
        section, dot, name = key.partition(".")
        if not dot or not section or not name:
            raise ConfigError(f"a config key is section.key, got {key!r}")
        value = os.fspath(value) if isinstance(value, os.PathLike) else value
        cfg = from_dict({section: _nested(name, value)}, cfg)
    return cfg


def apply_overrides(cfg: Config, overrides: Iterable[str]) -> Config:
    """Apply `section.key=value` strings; values are parsed as TOML, else taken as strings.

    For a string or bool key, a value that TOML reads as another type is taken as written:
    `producer.id=1e3` is "1e3" (not "1000.0"), `run.dir=2024-01-01` is a name (not a date),
    `run.resume=1` is true (as "1" would be)."""
    sections = _section_types()
    for item in overrides:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if sep and f"{section}.{name}" in MOVED:
            log.warning("%s is now %s: read as that (rename it)", key.strip(), MOVED[key.strip()])
            section, dot, name = MOVED[f"{section}.{name}"].partition(".")
        if not sep or not dot:
            raise ConfigError(f"--set expects section.key=value, got {item!r}")
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw
        tp = _field_type(sections[section], name) if section in sections else None
        if choices(tp):
            tp = str
        if tp in (str, bool) and not isinstance(value, str | tp):
            value = raw.strip()
        cfg = from_dict({section: _nested(name, value)}, cfg)
    return cfg


def to_dict(cfg: Config) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def to_toml(cfg: Config) -> str:
    return tomli_w.dumps(to_dict(cfg))


def write(cfg: Config, path: Path) -> None:
    path.write_text(to_toml(cfg))


def _suggest(name: str, options: Iterable[str]) -> str:
    """The closest option, an abbreviation first: `learning_rate` suggests 'lr' (its words'
    initials), not the merely similar 'lr_min_ratio'; `lr` suggests 'learning_rate' alike."""
    options = list(options)
    short = [o for o in options if o == _initials(name) or _initials(o) == name]
    close = short or difflib.get_close_matches(name, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _initials(name: str) -> str:
    """`learning_rate` -> 'lr' (a name of one word has none: '')."""
    words = [w for w in name.split("_") if w]
    return "".join(w[0] for w in words) if len(words) > 1 else ""


def _elsewhere(key: str) -> str:
    """A suggestion for a key given in the wrong section, found by its name in the others
    (`run.max_staleness`: 'staleness.max_staleness'; `train.model_path`: 'model.path')."""
    keys = {
        f"{n}.{f.name}": f"{n}_{f.name}"
        for n, t in _section_types().items()
        for f in dataclasses.fields(t)
    }
    by_name = [k for k in keys if k.split(".")[1] == key]
    close = by_name or [
        k for k in keys if difflib.get_close_matches(key, [keys[k]], n=1, cutoff=0.8)
    ]
    return f" (did you mean {close[0]!r}?)" if close else ""


def _coerce(section_cls: type[Any], key: str, value: Any, where: str) -> Any:
    fields = {f.name: f for f in dataclasses.fields(section_cls)}
    if key not in fields:
        hint = _suggest(key, fields) or _elsewhere(key)
        raise ConfigError(f"unknown key {where}{hint}")
    tp = typing.get_type_hints(section_cls)[key]
    allowed = choices(tp)
    out = _coerce_value(type(allowed[0]) if allowed else tp, value, where)
    if allowed and out not in allowed:
        raise ConfigError(f"{where} = {out!r} is not one of {', '.join(map(repr, allowed))}")
    return out


def _coerce_value(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is list:
        (inner,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{where} must be a list")
        return [_coerce_value(inner, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a table")
        return tp(**{k: _coerce(tp, k, v, f"{where}.{k}") for k, v in value.items()})
    if origin in (typing.Union, types.UnionType):
        raise AssertionError(f"{where}: optional config fields are not used")
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
    elif tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    elif tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    elif tp is str and isinstance(value, str | int | float) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{where} must be {tp.__name__}, got {value!r}")

"""Hypothesis strategies for wire messages, the edges of the contract included.

- `groups(limits)`: groups that the run `limits` must accept. Token ids lean on 0 and vocab - 1,
  behaviour log-probs on 0.0, -0.0, the smallest negative subnormal and the most negative finite
  float32, completions on 1 and `max_completion_tokens` tokens, prompts on 1 and
  `max_prompt_tokens`; per-token versions sometimes present; kept sets (a truncated run,
  `limits.max_kept > 0`) of 1 to max_kept ids, leaning on both, ids on 0 and vocab - 1, and
  sometimes tokens whose kept set is unknown.
- `messages(limits)`: a message of any kind, its fields drawn from its type hints (groups from
  `groups`, leases from `leases`: a prompt as text or as chat messages, columns a JSON object).
- `omitting_optional(msg)`: the bytes of `msg` as an older peer sends them, with any subset of
  the fields that have defaults left out (nested ones too), and the message they must decode to.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import msgpack
import numpy as np
from hypothesis import strategies as st

from common import wire
from common.sampling import kept_set

F32_LOWEST = float(np.finfo(np.float32).min)  # the most negative finite float32
F32_TINY = float(np.finfo(np.float32).smallest_subnormal)
EDGE_LOGPROBS = (0.0, -0.0, -F32_TINY, F32_LOWEST, -1e-7, -88.0)
KINDS: dict[str, type[Any]] = {cls.KIND: cls for cls in typing.get_args(wire.Message)}
HINTS: dict[type[Any], dict[str, Any]] = {}


def token_ids(vocab_size: int) -> st.SearchStrategy[int]:
    return st.sampled_from([0, vocab_size - 1]) | st.integers(0, vocab_size - 1)


def logprobs() -> st.SearchStrategy[float]:
    return st.sampled_from(EDGE_LOGPROBS) | st.floats(
        min_value=F32_LOWEST, max_value=0.0, allow_nan=False, width=32
    )


def _length(low: int, high: int) -> st.SearchStrategy[int]:
    return st.sampled_from([low, high]) | st.integers(low, high)


@st.composite
def groups(draw: st.DrawFn, limits: wire.Limits) -> wire.Group:
    """A group the run `limits` accepts (vocab_size, group_size and temperature must be set)."""
    assert limits.vocab_size, "the run's vocabulary"
    assert limits.group_size, "the run's G"
    assert limits.temperature, "the run's temperature"
    ids = token_ids(limits.vocab_size)
    G = limits.group_size
    lens = draw(st.lists(_length(1, limits.max_completion_tokens), min_size=G, max_size=G))
    n = sum(lens)
    behavior_version = draw(st.integers(0, 2**31 - 2))
    per_token = draw(st.booleans())
    versions = (
        [behavior_version, *draw(st.lists(st.integers(behavior_version, 2**31 - 1),
                                           min_size=n - 1, max_size=n - 1))]
        if per_token
        else []
    )  # fmt: skip
    f32 = st.floats(allow_nan=False, allow_infinity=False, width=32)
    completion_ids = np.array(draw(st.lists(ids, min_size=n, max_size=n)), np.int32)
    kept = draw(kept_sets(completion_ids, limits)) if limits.max_kept else kept_set.KeptSets()
    return wire.Group(
        lease_id=draw(st.integers(0, 2**63 - 1)),
        producer_id=draw(st.text(max_size=8)),
        prompt_index=draw(st.integers(0, 2**63 - 1)),
        behavior_version=behavior_version,
        prompt_ids=np.array(
            draw(st.lists(ids, min_size=1, max_size=limits.max_prompt_tokens)), np.int32
        ),
        completion_ids=completion_ids,
        completion_lens=np.array(lens, np.int32),
        behavior_logp=np.array(draw(st.lists(logprobs(), min_size=n, max_size=n)), np.float32),
        token_versions=np.array(draw(st.permutations(versions)) if versions else [], np.int32),
        rewards=np.array(draw(st.lists(f32, min_size=G, max_size=G)), np.float32),
        finish_reasons=tuple(draw(st.lists(st.sampled_from(wire.FINISH_REASONS), min_size=G,
                                           max_size=G))),
        temperature=limits.temperature,
        num_reward_errors=draw(st.integers(0, G)),
        gen_s=draw(st.floats(0.0, 1e6)),
        kept_counts=kept.other_counts(), kept_ids=kept.ids, kept_unknown=kept.unknown,
    )  # fmt: skip


@st.composite
def kept_sets(draw: st.DrawFn, tokens: np.ndarray, limits: wire.Limits) -> kept_set.KeptSets:
    """Legal kept sets of `tokens` for the run `limits` (vocab_size > max_kept > 0)."""
    vocab, most = limits.vocab_size, limits.max_kept
    assert vocab
    assert most
    assert vocab > most
    others, unknown = [], []
    for t, token in enumerate(tokens.tolist()):
        if draw(st.integers(0, 9)) == 0:
            unknown.append(t)
            others.append(np.zeros(0, np.int32))
            continue
        size = draw(_length(1, most))
        pool = st.sampled_from([0, vocab - 1]) | st.integers(0, vocab - 1)
        chosen = draw(st.sets(pool.filter(lambda i, token=token: i != token),
                              min_size=size - 1, max_size=size - 1))  # fmt: skip
        others.append(np.array(sorted(chosen), np.int32))
    return kept_set.from_lists(others, unknown)


def _hints(cls: type[Any]) -> dict[str, Any]:
    if cls not in HINTS:
        HINTS[cls] = typing.get_type_hints(cls)
    return HINTS[cls]


def _of_type(tp: Any) -> st.SearchStrategy[Any]:
    """Values of a field type as the schema declares it (floats never NaN: they compare)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return st.one_of([_of_type(a) for a in typing.get_args(tp)])
    if origin is tuple:
        return st.lists(_of_type(typing.get_args(tp)[0]), max_size=3).map(tuple)
    if origin is dict:
        return st.dictionaries(st.text(max_size=6), st.floats(allow_nan=False), max_size=3)
    if tp is wire.Lease:
        return leases()
    if dataclasses.is_dataclass(tp):
        fields = {f.name for f in dataclasses.fields(tp)}  # not the ClassVar KIND
        kwargs = {k: _of_type(v) for k, v in _hints(tp).items() if k in fields}
        if tp is wire.Status:  # a positive, finite heartbeat period (`wire.check_status`)
            kwargs["heartbeat_s"] = st.floats(1e-3, 1e6)
        if tp is wire.LeaseRequest:  # a wait in [0, MAX_LEASE_WAIT_S] (`check_lease_request`)
            kwargs["wait_s"] = st.floats(0.0, wire.MAX_LEASE_WAIT_S)
        return st.builds(tp, **kwargs)
    return {
        type(None): st.none(),
        int: st.integers(-(2**63), 2**64 - 1),
        float: st.floats(allow_nan=False),
        str: st.text(max_size=8),
        bytes: st.binary(max_size=16),
        bool: st.booleans(),
    }[tp]


@st.composite
def leases(draw: st.DrawFn) -> wire.Lease:
    """A lease the decoder accepts: a prompt as text or as chat messages (one of them), its
    columns "" or a JSON object's text."""
    chat = draw(st.booleans())
    turns = st.builds(wire.ChatTurn, st.text(min_size=1, max_size=6), st.text(max_size=8))
    columns = st.sampled_from(["", "{}", '{"unit": "cm", "n": [1, 2]}']) | st.text(max_size=8).map(
        lambda t: "{" + t + "}"
    )
    return wire.Lease(
        lease_id=draw(_of_type(int)), prompt_index=draw(_of_type(int)),
        step=draw(_of_type(int)), min_version=draw(_of_type(int)),
        prompt="" if chat else draw(st.text(min_size=1, max_size=8)),
        answer=draw(st.text(max_size=8)),
        messages=tuple(draw(st.lists(turns, min_size=1, max_size=3))) if chat else (),
        columns=draw(columns),
    )  # fmt: skip


def messages(limits: wire.Limits) -> st.SearchStrategy[Any]:
    """Any kind of message; a group valid for `limits`."""
    return st.sampled_from(sorted(KINDS)).flatmap(
        lambda kind: groups(limits) if kind == "group" else _of_type(KINDS[kind])
    )


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _omit(draw: st.DrawFn, obj: Any, body: dict[str, Any]) -> Any:
    """Drop a drawn subset of `obj`'s defaulted fields from `body` (recursively); return `obj` as
    the receiver must see it (those fields at their defaults)."""
    changes = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        has_default = f.default is not dataclasses.MISSING or (
            f.default_factory is not dataclasses.MISSING
        )
        if has_default and f.name in body and draw(st.booleans()):  # (left out when empty)
            del body[f.name]
            changes[f.name] = _default(f)
        elif dataclasses.is_dataclass(value):
            changes[f.name] = _omit(draw, value, body[f.name])
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            items = zip(value, body[f.name], strict=True)
            changes[f.name] = tuple(_omit(draw, v, b) for v, b in items)
    return dataclasses.replace(obj, **changes)


@st.composite
def omitting_optional(draw: st.DrawFn, msg: Any) -> tuple[bytes, Any]:
    """(bytes without some defaulted fields, the message those bytes mean)."""
    body = msgpack.unpackb(wire.encode(msg), raw=False)
    expected = _omit(draw, msg, body)
    return msgpack.packb(body, use_bin_type=True), expected


def optional_fields(cls: type[Any]) -> list[str]:
    """Names of the fields of `cls` that have defaults (an older peer may leave them out)."""
    return [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ]


def assert_same(a: Any, b: Any) -> None:
    """Message equality that compares `Group` arrays by value and dtype."""
    assert type(a) is type(b)
    if not isinstance(a, wire.Group):
        assert a == b
        return
    for f in dataclasses.fields(wire.Group):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype, f.name
            assert np.array_equal(x, y), f.name
        else:
            assert x == y, f.name

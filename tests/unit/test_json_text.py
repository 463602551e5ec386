"""`dumps_sorted` writes exactly what one `json.dumps(obj, sort_keys=True)` writes."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from common.files.json_text import dumps_sorted

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=30,
)


@given(obj=values, depth=st.integers(0, 4))
def test_the_text_is_one_json_dumps_with_sorted_keys(obj, depth):
    assert dumps_sorted(obj, depth=depth) == json.dumps(obj, sort_keys=True)


def test_a_producers_file_reads_back_as_written():
    producers = {f"p{i}": {"state": "idle", "counters": {"b": 1.0, "a": 2.0}} for i in range(3)}
    data = {"unix_time": 1.5, "producers": producers}
    assert json.loads(dumps_sorted(data, depth=2)) == data

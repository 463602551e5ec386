"""The reward of docs/custom_task/README.md's own-Parquet example: it reads two columns of the row.

`answer` and `tolerance` are parameters named after columns of the Parquet file, so each call
gets that row's values (the answer as text, the tolerance as the integer it is in the file);
`completion` is the completion's text. Named in the config as "within:within".
"""

from __future__ import annotations

import re

_INT = re.compile(r"-?\d+")


def within(completion: str, answer: str, tolerance: int) -> float:
    """1.0 when the first number of the completion is at most `tolerance` from the answer,
    0.5 when it misses by one more than that, else 0.0 (also when it holds no number)."""
    found = _INT.search(completion)
    if found is None:
        return 0.0
    miss = abs(int(found.group()) - int(answer))
    return 1.0 if miss <= tolerance else 0.5 if miss == tolerance + 1 else 0.0

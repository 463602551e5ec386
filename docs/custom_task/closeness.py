"""A custom reward for docs/custom_task: partial credit for a number close to the answer.

A reward is any function `fn(completion: str, answer: str) -> float`, named in the config as
"module:function" (here "closeness:closeness"). It runs on the producer, in a pool of worker
processes, once per completion: the module must be importable on every producer host
(installed, or its directory on PYTHONPATH). It gets the completion text (prompt excluded)
and the JSONL row's answer field as text; it returns a finite float. A call that raises,
returns something else, or runs longer than rewards.timeout_s scores 0, is counted, and is
logged by the producer with the reason.
"""

from __future__ import annotations

import re

_INT = re.compile(r"-?\d+")


def closeness(completion: str, answer: str) -> float:
    """1.0 for the exact number, less the further the first number of the completion is from
    it (0.5 at a distance of 1, 0.25 at 3: 1 / (1 + distance)); 0.0 when it holds no number."""
    found = _INT.search(completion)
    if found is None:
        return 0.0
    return 1.0 / (1.0 + abs(int(found.group()) - int(answer)))

"""The built-in `code_tests` reward: run a completion's code against its row's tests, in the
sandbox; the score is the fraction of the tests that pass.

`code_tests(completion, tests)` reads the row's `tests` column: a list of Python snippets (each
usually one `assert`), or one string of them, one per line. The program is the last fenced
```python block of the completion (else its last fenced block, else the whole text). One
sandboxed execution (producer/sandbox/runner.py) runs a harness that executes the program
as module `solution`, then each test in the program's namespace (a failing test is a test that
did not pass, nothing more), and reports each test that
passed on stdout behind a nonce drawn for this execution; the score is passed / len(tests).

Invariants:
- An execution that did not run its tests to the end raises `Contained(reason)`: a limit ended
  it (`timeout`, `cpu`, `memory`, `output`, `crash`), or the program raised or exited at its
  top level, or a test ended the process (`error`: the harness never wrote its last line).
  The reward worker scores it 0 and counts it under `sandbox_<reason>`
  (producer/rewards/worker.py), apart from reward errors: the completion's code misbehaved, not
  the reward. Tests that passed before the end count for nothing.
- Printing or exiting cannot fake a pass: a pass is the nonce's line, and the nonce reaches the
  harness on stdin, read before the program runs. (A program that searches the harness's
  memory for it could; docs/sandbox.md.)
- No tests, or tests that are not a list of strings: `ValueError` (a reward error: the row is
  wrong, not the completion).
Limits: `LIMITS` by default; call `score(completion, tests, limits=...)` from a reward of your
own for others.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from producer.sandbox.limits import Limits
from producer.sandbox.runner import run_python

# A quarter CPU per execution (with the cgroup's start burst, producer/sandbox/cgroups.py): a
# program that keeps computing, or a fork bomb's processes together, takes at most a quarter of a
# core from the honest groups scored beside it (bench/sandbox.py `honest_ratio`), while an
# honest program (~25 ms of CPU) is not slowed. The CPU a program gets is at most
# wall_s x cpu_share = 0.5 s.
LIMITS = Limits(
    wall_s=2.0,
    cpu_s=1.0,
    memory_mib=256,
    max_processes=8,
    max_output_bytes=64 << 10,
    cpu_share=0.25,
)
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
HARNESS = """\
import json, sys
_job = json.loads(sys.stdin.read())
sys.stdin.close()
_nonce, _tests = _job.pop("nonce"), _job.pop("tests")
_ns = {"__name__": "solution"}
exec(compile(_job.pop("code"), "solution.py", "exec"), _ns)
for _i, _test in enumerate(_tests):
    try:
        exec(compile(_test, f"test_{_i}", "exec"), _ns)
    except MemoryError:
        raise
    except Exception as _exc:
        print(f"test {_i} failed: {type(_exc).__name__}: {_exc}", file=sys.stderr)
    else:
        sys.stdout.write(f"\\n{_nonce} {_i}\\n")
        sys.stdout.flush()
sys.stdout.write(f"\\n{_nonce} end\\n")
"""


class Contained(Exception):
    """The execution hit a limit (`reason`: one of producer/sandbox/limits.py REASONS)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}{': ' + detail if detail else ''}")
        self.reason = reason


def program_of(completion: str) -> str:
    """The code to run: the last ```python block, else the last fenced block, else the text.
    A block the completion did not close (cut at `sampling.max_new_tokens`) runs to its end."""
    closed = completion.count("```") % 2 == 0
    blocks = _FENCE.findall(completion if closed else completion + "\n```")
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if python:
        return str(python[-1])
    return str(blocks[-1][1]) if blocks else completion


def snippets_of(tests: Any) -> list[str]:
    """The row's tests as a list of snippets; `ValueError` if there are none."""
    if isinstance(tests, str):
        tests = [line for line in tests.splitlines() if line.strip()]
    if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
        raise ValueError("the row's tests must be a list of strings (or one string of lines)")
    if not tests:
        raise ValueError("the row has no tests")
    return tests


def score(completion: str, tests: Any, *, limits: Limits = LIMITS) -> float:
    """Fraction of `tests` the completion's program passes (see the module docstring)."""
    snippets = snippets_of(tests)
    nonce = secrets.token_hex(16)
    job = json.dumps({"nonce": nonce, "tests": snippets, "code": program_of(completion)})
    run = run_python(HARNESS, stdin=job, limits=limits)
    if run.reason != "ok":
        raise Contained(run.reason, f"after {run.wall_s:.2f} s")
    passed, ended = set(), False
    for line in run.stdout.splitlines():
        head, _, index = line.partition(" ")
        if head == nonce and index.isdigit():
            passed.add(int(index))
        ended = ended or (head == nonce and index == "end")
    if not ended:
        raise Contained("error", "the program ended its process before its tests ran")
    return len(passed & set(range(len(snippets)))) / len(snippets)


def code_tests(completion: str, tests: Any) -> float:
    """The built-in reward `code_tests` (rewards.fns): `score` with the default `LIMITS`."""
    return score(completion, tests)

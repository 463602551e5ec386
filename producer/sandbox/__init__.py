"""Model-written code, run contained: `run_python(code, stdin=..., limits=Limits(...))`.

One execution per call, in a process tree of its own with CPU time, wall time, memory, process,
open-file and output limits, no network, a private writable /tmp, and nothing of the host's
run directory, keys or home to read (producer/sandbox/jail.py: how, by mechanism). The built-in
`code_tests` reward (producer/sandbox/code_reward.py) and any multi-turn environment's Python
tool call `run_python`; docs/sandbox.md is the user's page.

- limits.py: what one execution may use (`Limits`) and how it ended (`Execution`, reasons);
- jail.py: the mechanism this host allows and bubblewrap's command line;
- runner.py: `run_python`: one process tree per execution, fed, read, bounded, killed whole;
- prelude.py: the first code inside the sandbox: cgroups, rlimits, its own user id, audit hook;
- cgroups.py: a CPU quota and a process cap of its own, where the host allows;
- code_reward.py: the built-in `code_tests` reward.
"""

from producer.sandbox.jail import mechanism
from producer.sandbox.limits import REASONS, Execution, Limits
from producer.sandbox.runner import SandboxError, run_python

__all__ = ["REASONS", "Execution", "Limits", "SandboxError", "mechanism", "run_python"]

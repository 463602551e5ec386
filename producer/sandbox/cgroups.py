"""A cgroup of its own per execution, where the host lets this process make one: a CPU quota
(`Limits.cpu_share` CPUs at most, whatever the number of its processes) and a process cap
(`pids.max`), on the cgroup v1 `cpu` and `pids` hierarchies.

Without it (cgroup v2 without a delegated subtree, no write access, not Linux) the rlimits still
hold: CPU time per process, RLIMIT_NPROC. With it, a fork bomb's processes share one quota, so
on a small host they cannot take the cores that honest executions beside them need.

The CPU quota is a rate (`cpu_share` CPUs in every 100 ms period) with a burst as large as the
quota (`cpu.cfs_burst_us`, where the kernel has it): a new execution may use twice its quota in
its first period, so an honest program, which ends within ~25 ms of CPU (an interpreter and a
few tests), is not throttled even at a quarter CPU, while one that keeps computing is held to
`cpu_share` CPUs from its second period on.

`ExecutionGroups.make()` creates `<root>/asyncgrpo-sandbox-<pid>-<n>` in each hierarchy it can
write and sets its limits; the sandbox's prelude moves itself in before it runs the program
(bubblewrap binds each group's `cgroup.procs` to `/sandbox/cgroup/<name>`, see jail.py), and
`remove()` deletes the groups once every process of the execution has been reaped.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

V1_ROOTS = {"cpu": Path("/sys/fs/cgroup/cpu"), "pids": Path("/sys/fs/cgroup/pids")}
# Each execution's group sits at the top of the hierarchy, beside the producer's own processes,
# not under a common parent: there it competes for the CPU as one process would (capped at its
# quota). Under a common parent every execution on the host together weighed as much as one
# process, so a hostile program's share came out of the honest ones beside it whenever other
# work kept the cores busy.
PREFIX = "asyncgrpo-sandbox-"
PERIOD_US = 100_000
REMOVE_TRIES = 100
_serial = itertools.count()


@dataclass
class ExecutionGroups:
    """The cgroups of one execution: {hierarchy name: its directory}."""

    dirs: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def make(cls, *, cpu_share: float, max_processes: int) -> ExecutionGroups:
        """Groups in every hierarchy this process can write (none is not an error)."""
        out = cls()
        name = f"{os.getpid()}-{next(_serial)}"
        quota_us = int(cpu_share * PERIOD_US)
        settings = {
            "cpu": {"cpu.cfs_period_us": PERIOD_US, "cpu.cfs_quota_us": quota_us},
            "pids": {"pids.max": max_processes},
        }
        # the burst: written after the quota, it lets a new group start with twice its quota
        # of CPU time (the kernel's most: burst <= quota); kernels >= 5.14 have it
        optional = {"cpu.cfs_burst_us": quota_us}
        for kind, root in V1_ROOTS.items():
            if not os.access(root, os.W_OK):
                continue
            directory = root / f"{PREFIX}{name}"
            try:
                directory.mkdir()
                for key, value in settings[kind].items():
                    (directory / key).write_text(str(value))
                for key, value in optional.items():
                    with contextlib.suppress(OSError):  # absent, or refused: the quota holds
                        (directory / key).write_text(str(value))
            except OSError:
                with contextlib.suppress(OSError):
                    directory.rmdir()
                continue
            out.dirs[kind] = directory
        return out

    def procs_files(self) -> dict[str, Path]:
        """{hierarchy: its group's cgroup.procs}, what the prelude writes its pid to."""
        return {kind: d / "cgroup.procs" for kind, d in self.dirs.items()}

    def remove(self) -> None:
        """Delete the groups (their processes are reaped before this is called; the kernel may
        take a moment to let go of a group whose last process just exited: retried ~1 s)."""
        for directory in self.dirs.values():
            for _ in range(REMOVE_TRIES):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY while its last tasks finish exiting
                    time.sleep(0.01)
        self.dirs.clear()

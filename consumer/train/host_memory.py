"""How the learner's process gives freed host memory back (glibc's malloc), set once at start.

torch's CPU tensors come from `malloc`. glibc serves a block of at least `M_MMAP_THRESHOLD` bytes
with its own `mmap` and returns it to the system when freed; smaller ones come from arenas that
rarely shrink. The threshold starts at 128 KiB and, by default, rises to the size of any mmapped
block that is freed (up to 32 MiB): after the first step freed its activations, the next step's
activations (blocks of 1-10 MB on SmolLM2-135M) land in arenas, which then hold the step's peak
for good, and fragment as the optimizer state and the gradients come and go between them.
`release_freed_blocks` fixes the threshold (glibc then stops moving it): every block of at least
`threshold_bytes` is mapped and unmapped on its own, so the resident set follows the bytes in
use. Every rank of the consumer calls it first thing (consumer/learner.py `main`). The price is
the page faults of mapping a step's activations afresh (bench/learner_memory.py measures both
sides).

A no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("asyncgrpo.consumer")
M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter numbers (malloc.h)
THRESHOLD_BYTES = 1 << 20


def release_freed_blocks(threshold_bytes: int = THRESHOLD_BYTES) -> bool:
    """Blocks of at least `threshold_bytes` mapped and unmapped on their own (glibc); whether
    it took effect."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt") or not hasattr(libc, "gnu_get_libc_version"):
        return False
    if not libc.mallopt(M_MMAP_THRESHOLD, threshold_bytes):
        return False
    log.info(
        "host memory: blocks of %d KiB and more go back to the system when freed",
        threshold_bytes >> 10,
    )
    return True

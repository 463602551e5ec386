"""The consumer's model directory, for producers on hosts without a copy of it.

`listing(model_dir)`: every file of the directory a model needs (its weights, config and
tokenizer files: the names matching common/host/model_dir.py `MODEL_FILES`, in the directory
itself), each with its size and BLAKE3 digest, in name order. The consumer sends it in the run
spec (`wire.RunSpec.model_files`) and its data socket serves exactly those files
(consumer/snapshots/dataplane.py: `file_chunk_req` of file `model/NAME`); a producer that has
no copy fetches them and checks each against its digest (producer/base_model.py). Hashing reads
every file once at the consumer's start (BLAKE3 on every core: about 0.5 s per GB).
"""

from __future__ import annotations

import fnmatch
from pathlib import Path

from common import wire
from common.host.model_dir import MODEL_FILES
from common.weights import snapshot as snap

PREFIX = "model/"  # a `file_chunk_req`'s file naming one of them


def listing(model_dir: Path) -> tuple[wire.ModelFile, ...]:
    """The files of `model_dir` a producer needs to load the model (module docstring)."""
    wanted = sorted(
        p
        for p in model_dir.iterdir()
        if p.is_file() and any(fnmatch.fnmatch(p.name, pattern) for pattern in MODEL_FILES)
    )
    return tuple(wire.ModelFile(p.name, p.stat().st_size, snap.hash_file(p)) for p in wanted)

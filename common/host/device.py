"""Where torch work runs: one rule for the learner (`model.device`) and the hf engine
(`producer.device`). Imports torch: only modules that already use torch import this one."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    """'auto' = cuda if available, else cpu; anything else ('cpu', 'cuda', 'cuda:N') is passed
    to torch as written."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)

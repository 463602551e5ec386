"""The learner's torch threads taken again at every decoder layer of a pass, forward and backward.

Why: a forward/backward pass of a real model lasts seconds (SmolLM2-135M on the 2-core machine: a
step of 8 groups, one pass, 7-20 s). Threads taken once per pass keep the count the core board
gave at the pass's start for all of it: a learner that started while the producer sampled kept
one thread after the producer finished and a core idled for the rest of the pass. Taking them
before each layer's forward and before each layer's backward follows the board within one
layer's time (tens of milliseconds).

How: a forward pre-hook on every decoder layer, and a forward hook that puts a gradient hook on
the layer's output; the gradient hook runs when the output's gradient is ready, that is right
before the layer's own backward, on the thread that runs the backward (autograd runs a CPU
graph on the calling thread), so `torch.set_num_threads` there applies to that layer's backward.
The hooks act only between `active()`'s enter and exit (the trainer's passes), never during an
evaluation's generation on the same model. With gradient checkpointing the recomputed forward
takes threads too. Every unit's threads go to `take`'s caller's record, in order (a replay runs
the same units in the same order and gets them back: thread counts change a CPU step's float
rounding). A model without a `layers` list of decoder layers (or a compiled one: hooks would
break its graphs) keeps threads per pass.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch


class LayerThreads:
    """Calls `take()` before every decoder layer's forward and backward while active."""

    def __init__(self, model: Any, take: Callable[[], int]) -> None:
        self.take = take
        self._active = False
        self.layers = decoder_layers(model)
        for layer in self.layers:
            layer.register_forward_pre_hook(self._before_forward)
            layer.register_forward_hook(self._after_forward)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Hooks act inside (a pass: its forward and its backward)."""
        self._active = True
        try:
            yield
        finally:
            self._active = False

    def _before_forward(self, module: torch.nn.Module, args: Any) -> None:
        if self._active:
            self.take()

    def _after_forward(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if not self._active or not torch.is_grad_enabled():
            return
        hidden = out if isinstance(out, torch.Tensor) else out[0] if out else None
        if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
            hidden.register_hook(self._before_backward)  # type: ignore[no-untyped-call]

    def _before_backward(self, grad: torch.Tensor) -> None:
        if self._active:
            self.take()


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The decoder layers of a transformers causal LM (peft-wrapped too); [] if not found."""
    get = getattr(model, "get_decoder", None)
    try:
        decoder = get() if callable(get) else None
    except (AttributeError, NotImplementedError):
        decoder = None
    layers = getattr(decoder, "layers", None)
    return list(layers) if isinstance(layers, torch.nn.ModuleList) else []

"""Host copies of the policy's weights, each one whole safetensors file in memory, and the one
device-to-host copy that fills them.

`HostWeights(table, pin=...)` preallocates `table.num_bytes` bytes (page-locked when the weights
live on a GPU) holding the file exactly as it will be on disk: the header, written once, then every
tensor at its slot of the `TensorTable` (common/weights/tensor_table.py), one flat range per dtype.
`HostCopier.copy(state, host)` copies a state dict into it: on CUDA every tensor is enqueued on a
side stream (non-blocking, into pinned memory) and a `Fence` (a CUDA event) marks the end, so
the training thread returns at once; on CPU the same call copies synchronously into a plain
buffer, in a few large parts (see `HostCopier._copy_on_cpu`). The file's bytes are then
`host.file_bytes()`, written and hashed without another copy.

Invariants:
- Tied weights are stored once, under the first name (`unique_tensors`; what `save_pretrained`
  and `safetensors.torch.save_model` keep).
- Floating-point tensors are stored in the snapshot dtype, others in their own (`table_for`).
- A copy reads the weights as they are when `copy` is called: the side stream first waits for
  the compute stream. Whoever changes the weights next (the optimizer step) must first call
  `Fence.hold_stream()` (a GPU-side wait: the host does not block). Whoever reads the buffer
  (the writer thread) first calls `Fence.wait()`.
- CPU weights already in the snapshot's dtype (a float32 learner, float32 snapshots) of at least
  `LIVE_MIN_BYTES` need no buffer: `LiveWeights` hands the writer the header and the tensors
  themselves, and its `WrittenFence` makes the next optimizer step wait until the writer has
  read them (a write takes a fraction of a CPU step of such a model: the wait is usually none).
  SmolLM2-135M: 513 MB of host memory less.
- A buffer is never written while it is being read: `consumer/snapshots/publisher.py` hands each
  buffer either to the copier or to the writer, never to both.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import torch

from common.weights.tensor_table import TensorSpec, TensorTable, plan

DTYPE_CODES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.int64: "I64",
    torch.float32: "F32",
    torch.int32: "I32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}
TORCH_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


def unique_tensors(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` without tied duplicates (same memory and shape): the first name is kept."""
    seen: set[tuple[int, tuple[int, ...], torch.dtype]] = set()
    out = {}
    for name, tensor in state.items():
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if key in seen and tensor.numel():
            continue
        seen.add(key)
        out[name] = tensor
    return out


def stored_dtype(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    return dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype


def table_for(
    state: Mapping[str, torch.Tensor],
    dtype: torch.dtype | None,
    *,
    metadata: Mapping[str, str] | None = None,
) -> TensorTable:
    """The file layout of `state` (already without tied duplicates), floating-point tensors
    stored in `dtype` (None: each in its own); `metadata` in the header (default: format pt)."""
    specs = [
        TensorSpec(name, DTYPE_CODES[stored_dtype(t, dtype)], tuple(t.shape))
        for name, t in state.items()
    ]
    return plan(specs, metadata=metadata or {"format": "pt"})


class HostWeights:
    """One preallocated host buffer holding a whole safetensors file of `table`'s layout."""

    def __init__(self, table: TensorTable, *, pin: bool) -> None:
        self.table = table
        # zeros, not empty: the pages are touched now, not during the first copy
        self.data = torch.zeros(table.num_bytes, dtype=torch.uint8, pin_memory=pin)
        self.data[: table.data_start] = torch.frombuffer(bytearray(table.header), dtype=torch.uint8)
        self.views: dict[str, torch.Tensor] = {
            s.spec.name: self.data[s.begin : s.end]
            .view(TORCH_DTYPES[s.spec.dtype])
            .view(s.spec.shape)
            for s in table.slots
        }

    def file_bytes(self) -> memoryview:
        """The whole file, as it goes to disk (a view of this buffer, no copy)."""
        return self.data.numpy().data.cast("B")

    def file_parts(self) -> list[memoryview]:
        """The file in order, as parts to write one after another (here one)."""
        return [self.file_bytes()]


class LiveWeights:
    """The file of `table` made of the header and the live tensors themselves (no buffer):
    CPU weights already in the snapshot's dtype (`live_ok`). Valid until the weights change:
    the trainer holds the `WrittenFence` of the job before its next optimizer step."""

    def __init__(self, table: TensorTable, state: Mapping[str, torch.Tensor]) -> None:
        self.table = table
        self._tensors = [state[s.spec.name].detach() for s in table.slots]

    def file_parts(self) -> list[memoryview]:
        parts = [memoryview(self.table.header)]
        for t in self._tensors:
            if t.numel():
                parts.append(t.view(torch.uint8).reshape(-1).numpy().data.cast("B"))
        return parts


def live_ok(state: Mapping[str, torch.Tensor], dtype: torch.dtype | None, min_bytes: int) -> bool:
    """True when a snapshot of `state` can be written from the tensors themselves: every one a
    contiguous CPU tensor stored in its own dtype, and together at least `min_bytes` (below
    that a host copy costs little memory, and a step may be shorter than the write the next
    optimizer step would wait for)."""
    total = 0
    for t in state.values():
        if t.device.type != "cpu" or not t.is_contiguous() or t.dtype not in DTYPE_CODES:
            return False
        if stored_dtype(t, dtype) != t.dtype:
            return False
        total += t.numel() * t.element_size()
    return total >= min_bytes


class Fence:
    """The end of one copy into a host buffer (a CUDA event; None = already complete)."""

    def __init__(
        self, event: torch.cuda.Event | None = None, device: torch.device | None = None
    ) -> None:
        self._event, self._device = event, device

    def hold_stream(self) -> None:
        """Make the current CUDA stream wait for the copy before it runs anything enqueued later
        (e.g. the optimizer step changing the weights). The host does not block."""
        if self._event is not None:
            torch.cuda.current_stream(self._device).wait_event(self._event)

    def wait(self) -> None:
        """Block this thread until the copy is complete."""
        if self._event is not None:
            self._event.synchronize()

    def done(self) -> bool:
        return self._event is None or bool(self._event.query())  # type: ignore[no-untyped-call]


class WrittenFence(Fence):
    """The end of a write from the live weights (`LiveWeights`): `hold_stream` blocks the
    training thread until the writer has read every byte (written and hashed) or dropped the
    job; the writer does not wait for anything."""

    def __init__(self) -> None:
        super().__init__()
        self._read = threading.Event()

    def release(self) -> None:
        """The writer is done with the weights (or will never read them)."""
        self._read.set()

    def hold_stream(self) -> None:
        self._read.wait()

    def done(self) -> bool:
        return self._read.is_set()


class HostCopier:
    """Copies a state dict into `HostWeights`: one side CUDA stream per device, or plain CPU."""

    def __init__(self) -> None:
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._helpers: ThreadPoolExecutor | None = None  # CPU copies: the other parts

    @torch.no_grad()
    def copy(self, state: Mapping[str, torch.Tensor], host: HostWeights) -> Fence:
        """Copy `state` (the table's names, any order) into `host`; see the module invariants."""
        views = host.views
        if state.keys() != views.keys() or any(
            t.shape != views[name].shape for name, t in state.items()
        ):
            raise ValueError(
                "the weights no longer match the snapshot table (names or shapes changed): "
                f"missing {sorted(views.keys() - state.keys())[:3]}, "
                f"unexpected {sorted(state.keys() - views.keys())[:3]}"
            )
        devices = {t.device for t in state.values()}
        if len(devices) != 1:
            raise ValueError(f"weights on several devices ({sorted(map(str, devices))})")
        device = devices.pop()
        if device.type != "cuda":
            self._copy_on_cpu(state, views)
            return Fence()
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for name, src in state.items():
                src.record_stream(stream)  # a temporary source stays alive until copied
                views[name].copy_(src, non_blocking=True)
            # a waiting writer sleeps, not spins
            event = torch.cuda.Event(blocking=True)  # type: ignore[no-untyped-call]
            event.record(stream)
        return Fence(event, device)

    def _copy_on_cpu(
        self, state: Mapping[str, torch.Tensor], views: dict[str, torch.Tensor]
    ) -> None:
        """CPU copies in `torch.get_num_threads()` parts of about equal bytes, each part on its
        own thread with one intra-op thread, so the copy synchronises once, not once per tensor.
        A multi-threaded `copy_` per tensor is a parallel region whose threads must all be
        scheduled before it ends, which on a busy machine costs a scheduler wake-up per tensor
        (measured: 110 tensors, 128M parameters, 2 cores at load 3: 1.38 s that way, 0.10 s on
        one thread; at load 5, alternating buffers: one thread 1.24-1.57x a flat 2-thread copy
        of the same bytes, two parts 1.07-1.38x)."""
        threads = torch.get_num_threads()
        parts = _split(list(state.items()), threads)
        if len(parts) > 1 and self._helpers is None:
            self._helpers = ThreadPoolExecutor(threads - 1, thread_name_prefix="host-copy")
        helpers = self._helpers
        torch.set_num_threads(1)  # helpers start their torch work under it: one thread each
        try:
            pending = [helpers.submit(_copy, p, views) for p in parts[1:]] if helpers else []
            try:
                _copy(parts[0], views)
            finally:  # never leave a helper writing into a buffer we hand back
                for done in pending:
                    done.result()
        finally:
            torch.set_num_threads(threads)


def _copy(items: list[tuple[str, torch.Tensor]], views: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, src in items:
            views[name].copy_(src)


def _split(
    items: list[tuple[str, torch.Tensor]], parts: int
) -> list[list[tuple[str, torch.Tensor]]]:
    """`items` in at most `parts` consecutive runs of about equal bytes (none empty)."""
    total = sum(t.numel() * t.element_size() for _, t in items)
    out: list[list[tuple[str, torch.Tensor]]] = [[]]
    done = 0
    for name, t in items:
        if out[-1] and done >= total * len(out) / parts and len(out) < parts:
            out.append([])
        out[-1].append((name, t))
        done += t.numel() * t.element_size()
    return out

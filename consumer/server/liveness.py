"""Which producers went silent, and which ended long enough ago to be forgotten, found in time
proportional to the answer rather than to the number of producers (the network thread asks
every 0.25 s: consumer/server/loop.py). A pure structure: no sockets, no clock of its own.

Two orders, both kept by insertion at the current time, so each is sorted by its time:
- heard: producers by the monotonic time of their last message (`heard` moves one to the end);
  `silent(now, timeout_s)` pops from the front those not heard from for more than `timeout_s`.
- ended: producers by the time they left or went silent (`ended`); `due(now, after_s)` lists from
  the front those ended more than `after_s` ago. The caller checks each against its view (a
  producer that speaks again after leaving is no longer ended: `revive`) and drops the ones it
  forgets (`forget`).

Invariant: a producer is in `heard` exactly while the consumer waits to hear from it (registered,
neither left nor gone), with the time it was last heard from; `now` never goes backwards.
"""

from __future__ import annotations

from collections import OrderedDict


class Liveness:
    def __init__(self) -> None:
        self._heard: OrderedDict[str, float] = OrderedDict()  # producer -> last heard (s)
        self._ended: OrderedDict[str, float] = OrderedDict()  # producer -> ended at (s)

    def __len__(self) -> int:
        return len(self._heard)

    def heard(self, producer_id: str, now: float) -> None:
        """A message from `producer_id` at `now` (it is waited for from now on)."""
        self._heard[producer_id] = now
        self._heard.move_to_end(producer_id)

    def registered(self, producer_id: str, now: float) -> None:
        """`producer_id` registered (anew): heard at `now`, not ended."""
        self._ended.pop(producer_id, None)
        self.heard(producer_id, now)

    def ended(self, producer_id: str, now: float) -> None:
        """`producer_id` left or went silent at `now`: no longer waited for."""
        self._heard.pop(producer_id, None)
        self._ended[producer_id] = now
        self._ended.move_to_end(producer_id)

    def silent(self, now: float, timeout_s: float) -> list[str]:
        """Remove and return, oldest first, the producers not heard from for over `timeout_s`."""
        out = []
        while self._heard:
            producer_id, last = next(iter(self._heard.items()))
            if now - last <= timeout_s:
                break
            del self._heard[producer_id]
            out.append(producer_id)
        return out

    def due(self, now: float, after_s: float) -> list[str]:
        """The producers that ended more than `after_s` before `now`, oldest first (kept)."""
        out = []
        for producer_id, at in self._ended.items():
            if now - at <= after_s:
                break
            out.append(producer_id)
        return out

    def revive(self, producer_id: str) -> None:
        """`producer_id` is no longer ended (it spoke again): forget when it ended."""
        self._ended.pop(producer_id, None)

    def forget(self, producer_id: str) -> None:
        """Drop every record of `producer_id`."""
        self._heard.pop(producer_id, None)
        self._ended.pop(producer_id, None)

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

`SentPeriods` keeps the heartbeat period every status carries (common/net/heartbeat.py: longer
with more live producers) and the longest one a producer may still be sleeping on: a
producer beats at the period it heard last, so when the period shrinks (producers left), the
longer one is still tolerated until every producer has beaten once since: `longest_s` is the
maximum of the periods sent over the current window and the one before, a window lasting the
longest period then tolerated plus `_WINDOW_SLACK_S`. The silence tolerated is
`silence_limit_s(net.producer_timeout_s, longest_s)`.
"""

from __future__ import annotations

from collections import OrderedDict

from common.net.heartbeat import period_s, silence_limit_s

_WINDOW_SLACK_S = 5.0  # beyond a period: a heartbeat's round trip, a busy event loop


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


class SentPeriods:
    """The heartbeat period to send (`current`) and the longest a live producer may be using
    (`longest_s`); `floor_s` = net.heartbeat_s, `max_per_s` = net.max_heartbeats_per_s."""

    def __init__(self, floor_s: float, max_per_s: float) -> None:
        self.floor_s, self.max_per_s = floor_s, max_per_s
        self._current_max = self._previous_max = floor_s  # periods sent, this window and last
        self._window_end = 0.0  # monotonic seconds: the current window rolls over then

    def current(self, num_live: int, now: float) -> float:
        """The period for `num_live` live producers, recorded as sent at `now`."""
        period = period_s(num_live, floor_s=self.floor_s, max_per_s=self.max_per_s)
        if now >= self._window_end:  # whoever heard the previous window's periods beat since
            self._previous_max, self._current_max = self._current_max, period
            self._window_end = now + self.longest_s + _WINDOW_SLACK_S
        elif period > self._current_max:
            self._current_max = period
        return period

    @property
    def longest_s(self) -> float:
        """The longest period sent in this window or the one before."""
        return max(self._current_max, self._previous_max)

    def timeout_s(self, configured_s: float) -> float:
        """The silence after which a producer is gone: `configured_s` (net.producer_timeout_s),
        or three of the longest periods a producer may be using, when longer."""
        return silence_limit_s(configured_s, self.longest_s)

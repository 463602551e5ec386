"""The heartbeat rule both sides keep: control traffic per second that does not grow with the
number of producers, and silences tolerated in proportion to the period actually in use.

- The consumer chooses the period (seconds between two heartbeats of one producer):
  `period_s(live) = max(net.heartbeat_s, live / net.max_heartbeats_per_s)`, so all live
  producers together send at most `max(live / net.heartbeat_s, net.max_heartbeats_per_s)`
  heartbeats per second (64/s by default: nothing changes up to 64 producers at 1 s). Every
  status it sends carries the period (`wire.Status.heartbeat_s`); a producer beats at the one it
  heard last.
- Whoever waits for a heartbeat (the consumer for a producer, a producer for the consumer's
  replies) tolerates a silence of `silence_limit_s(configured, period) =
  max(configured, 3 * period)`: a slow heartbeat never makes a live peer look dead (two may be
  late or lost), a silent one is still found within three periods, and while the period is
  the configured one (a third of the timeout or less: few producers) nothing changes.
- A crowd (the period lengthened: more producers than `max_per_s` heartbeats allow at the
  floor) has more producers than open leases, so most of them are starved. Each waits at the
  consumer for leases to free up for `lease_wait_s(period) = LEASE_WAIT_PERIODS * period`
  (`wire.LeaseRequest.wait_s`) instead of polling: a lease freed at a step finds a request
  waiting for it, and the empty replies of all starved producers together stay under
  `max_per_s / LEASE_WAIT_PERIODS` per second. At the floor, requests wait `net.lease_wait_s`
  (the consumer's own limit, `wait_s` 0) as before.

Pure functions: no clock, no sockets.
"""

from __future__ import annotations

from common.wire.messages import MAX_LEASE_WAIT_S

SILENT_PERIODS = 3  # heartbeats in a row that may be missed (late, lost) before a peer is gone
LEASE_WAIT_PERIODS = 4  # how many periods a crowded producer's lease request waits at most
# a producer told the run is over waits this long for its goodbye's answer, and the consumer
# keeps answering that long after telling it (consumer/server/server.py `all_told_finished`)
GOODBYE_WAIT_S = 2.0


def period_s(num_live: int, *, floor_s: float, max_per_s: float) -> float:
    """The heartbeat period for `num_live` producers: `floor_s` (net.heartbeat_s), or longer
    so that they send no more than `max_per_s` heartbeats per second together."""
    return max(floor_s, num_live / max_per_s)


def silence_limit_s(configured_s: float, period: float) -> float:
    """How long a peer heartbeating every `period` seconds may stay silent before it is taken
    for gone: `configured_s` (a timeout key), or three periods when longer."""
    return max(configured_s, SILENT_PERIODS * period)


def lease_wait_s(period: float, *, floor_s: float) -> float:
    """How long a producer that heard `period` asks its lease request to wait at the consumer
    for leases (`wire.LeaseRequest.wait_s`): 0 (the consumer's `net.lease_wait_s`) at the floor
    (`floor_s`, net.heartbeat_s), `LEASE_WAIT_PERIODS` periods once it is lengthened, at most
    `wire.MAX_LEASE_WAIT_S`."""
    return 0.0 if period <= floor_s else min(LEASE_WAIT_PERIODS * period, MAX_LEASE_WAIT_S)

"""Pinning the loaded weights for evaluation leases (consumer/evaluation/rounds.py): pure rules on
the producer's `State`, run on its event loop with no await between a check and its pin.

An evaluation group must be sampled with exactly the version its lease names, and producers
keep only the newest weights. So:
- `pin_lease`: an eval lease that arrives while the engine holds exactly its version (and no
  reload is running) pins those weights until its group is sent (`State.pins`; the weights
  keeper starts no reload while pins > 0: producer/weights.py); one that arrives too late is
  given back unsampled with the next lease request (`State.declined`).
- `round_pin`: while the consumer's eval round still has prompts to lease for exactly the
  version loaded (`Status.eval_version`), or has no version yet and takes any from
  `Status.eval_from` on, the producer holds its version too, so that it can take them all (on
  top of its training slots) before it moves on; it lets go once the consumer says the round
  has none left (all leased, or given up). Without it a reload that starts while a lease
  request is on its way would make the producer give back the eval leases that come back.
"""

from __future__ import annotations

from common import wire
from producer.state import State


def pin_lease(state: State, engine_version: int, lease: wire.Lease) -> bool:
    """Pin the weights for `lease` (True), or give it back (False, counted)."""
    if engine_version != lease.eval_version or state.loading or state.weights_run != state.run_id:
        state.declined.append(lease.lease_id)
        state.count("eval_leases_declined")
        return False
    state.pins += 1
    return True


def round_pin(state: State, engine_version: int | None) -> None:
    """Take or release the round's pin as `State.eval_round` and the loaded version say."""
    wanted = engine_version is not None and (
        (state.eval_round >= 0 and state.eval_round == engine_version)
        or (state.eval_from >= 0 and engine_version >= state.eval_from)
    )
    hold = (
        wanted and (state.round_pinned or not state.loading) and state.weights_run == state.run_id
    )
    if hold != state.round_pinned:
        state.round_pinned = hold
        state.pins += 1 if hold else -1
        state.count("eval_round_pins" if hold else "eval_round_unpins")
        state.changed.bump()


def eval_room(state: State, slots: int) -> int:
    """Eval leases to ask for beyond the training slots: while the round's pin is held, up to
    `slots` eval groups in flight (the pins other than the round's own; `slots` is
    common/config/evaluation.py's `eval_slots`)."""
    return max(0, slots - (state.pins - 1)) if state.round_pinned else 0

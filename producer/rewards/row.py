"""What a held-out row carries to the reward functions: a lease's prompt, answer, chat messages
and other columns (`Row`, a protocol that `wire.Lease` and the consumer's rows both satisfy).

Read by the held-out judges (producer/rewards/judge.py, producer/episodes/heldout.py) in the
process that scores (launch's evaluation, the replay's evaluation child).
"""

from __future__ import annotations

from typing import Protocol

from common import wire


class Row(Protocol):
    """What a lease carries of one row (`wire.Lease`'s fields of the same names)."""

    @property
    def prompt(self) -> str: ...
    @property
    def answer(self) -> str: ...
    @property
    def messages(self) -> tuple[wire.ChatTurn, ...]: ...
    @property
    def columns(self) -> str: ...

"""Progress lines of long work (common/progress.py): every 10 s, the first unit, each tenth."""

from __future__ import annotations

import threading

from common.progress import Counter, heartbeat


def test_a_counter_says_the_first_unit_each_tenth_and_every_ten_seconds():
    said: list[str] = []
    now = [0.0]
    count = Counter(
        "building the demo model", 900, said.append, unit="warm-up steps", clock=lambda: now[0]
    )
    for done, t in ((1, 0.1), (2, 0.2), (89, 1.0), (90, 1.1), (100, 11.2), (101, 11.3)):
        now[0] = t
        count(done)
    assert said == [
        "building the demo model: 1/900 warm-up steps (0%), 0 s",
        "building the demo model: 90/900 warm-up steps (10%), 1 s",
        "building the demo model: 100/900 warm-up steps (11%), 11 s",
    ]


def test_a_heartbeat_says_that_work_goes_on_until_it_ends():
    said: list[str] = []
    beat = threading.Event()

    def say(text: str) -> None:
        said.append(text)
        beat.set()

    with heartbeat("converting the GGUF file", say, every_s=0.01):
        assert beat.wait(10)
    count = len(said)
    assert said[0].startswith("converting the GGUF file… ")
    assert said[0].endswith(" s")
    beat.clear()
    assert not beat.wait(0.05)  # none after the block
    assert len(said) == count

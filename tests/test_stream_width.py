"""StreamWidth: how many ranged GETs side by side a read-ahead stream is cut into, learned
from the throughput each width brings (a ramp like TCP's: doubling while it pays)."""

from __future__ import annotations

from avafs.tiers.ranges import GROWTH, REPROBE, StreamClock, StreamWidth

MB = 1_000_000


def _feed(widths: StreamWidth, rates: dict[int, float]) -> int:
    """Measures one stream at the current width, at the rate `rates` gives that width."""
    width = widths.width()
    widths.measured(width, int(rates[width] * MB), 1.0)
    return widths.width()


def test_it_starts_at_one_get_and_doubles_while_throughput_grows():
    widths = StreamWidth(8)
    assert widths.width() == 1
    rates = {1: 100, 2: 190, 4: 350, 8: 600}
    assert [_feed(widths, rates) for _ in range(4)] == [2, 4, 8, 8]


def test_a_doubling_that_does_not_pay_is_undone_and_tried_again_later():
    widths = StreamWidth(8)
    rates = {1: 100, 2: 190, 4: 190 * GROWTH * 0.9}
    assert [_feed(widths, rates) for _ in range(3)] == [2, 4, 2]
    settled = [_feed(widths, rates) for _ in range(REPROBE)]
    assert settled == [2] * (REPROBE - 1) + [4], "tries four again after REPROBE streams"


def test_measurements_of_another_width_are_ignored():
    widths = StreamWidth(8)
    widths.measured(1, 100 * MB, 1.0)
    widths.measured(1, 1 * MB, 1.0)  # a stream started before the width became 2
    assert widths.width() == 2
    widths.measured(2, 300 * MB, 1.0)
    assert widths.width() == 4


def test_it_never_exceeds_its_bound():
    widths = StreamWidth(2)
    rates = {1: 100, 2: 1000}
    assert [_feed(widths, rates) for _ in range(3)] == [2, 2, 2]


def test_a_clock_reports_once_its_last_get_is_read():
    widths = StreamWidth(8)
    clock = StreamClock(widths, 1, 10 * MB)
    assert widths.width() == 1
    clock.read_one()
    assert widths.width() == 2
    split = StreamClock(widths, 2, 10 * MB)
    split.read_one()
    assert widths.width() == 2, "one of two GETs read: nothing measured yet"
    split.read_one()
    assert widths.width() in (1, 4)

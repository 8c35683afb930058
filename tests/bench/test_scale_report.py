"""bench.scale's growth exponent: the slope of a log-log least-squares fit."""

from __future__ import annotations

from bench.scale_report import exponent


def test_exponent_of_a_power_law() -> None:
    assert exponent([(100, 10.0), (1000, 10.0 * 10**0.5), (5000, 10.0 * 50**0.5)]) == "0.50"
    assert exponent([(100, 3.0), (1000, 3.0)]) == "0.00"


def test_exponent_needs_two_sizes() -> None:
    assert exponent([(100, 3.0)]) == "-"
    assert exponent([(100, 3.0), (100, 4.0)]) == "-"


def test_profile_summary_counts_own_and_inclusive_samples() -> None:
    from bench.scale_profile import summarise

    collapsed = (
        "process 1;main (a/m.py:1);search (x/s.py:5) 7\n"
        "process 1;main (a/m.py:1);write (x/w.py:9) 3\n"
    )
    # (function (file), inclusive, self), by self samples; main is never on top
    assert summarise(collapsed) == [("search (x/s.py)", 7, 7), ("write (x/w.py)", 3, 3)]

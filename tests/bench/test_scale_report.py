"""bench.scale's growth exponent: the slope of a log-log least-squares fit."""

from __future__ import annotations

from bench.scale_report import exponent


def test_exponent_of_a_power_law() -> None:
    assert exponent([(100, 10.0), (1000, 10.0 * 10**0.5), (5000, 10.0 * 50**0.5)]) == "0.50"
    assert exponent([(100, 3.0), (1000, 3.0)]) == "0.00"


def test_exponent_needs_two_sizes() -> None:
    assert exponent([(100, 3.0)]) == "-"
    assert exponent([(100, 3.0), (100, 4.0)]) == "-"

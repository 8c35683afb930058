"""Shared test doubles, for faults and decisions the real components cannot be made to show.

Each module says which real part it stands in for and why the tier that uses it
cannot use the real one.
"""

"""Tests of the dev tooling (devtools/) and of the benchmarks' own logic (unit tier)."""

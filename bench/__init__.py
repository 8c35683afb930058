"""Benchmarks: each module runs with ``python -m bench.<name>`` and prints tables.

``python -m bench`` runs them all (``make bench``; ``--smoke`` for tiny sizes) and can
write the README's performance section. A module is a benchmark when it has, at module
level (the suite finds it by these alone, so a new one needs no registration):

* ``main(argv: Sequence[str] | None = None)``: parses ``argv`` as its command line
  (``None``: ``sys.argv[1:]``) and prints its tables; a failure raises or exits non-zero;
* ``SMOKE_ARGS: tuple[str, ...]``: arguments for a tiny run that still takes every path
  (the smoke tests run it and check only the output's shape, never a timing);
* ``CLUSTER``: what it needs, which decides where its smoke run goes:

  - ``"none"``: no cluster (unit tier);
  - ``"shared"``: the usual local cluster, reused if running (``bench.common.shared_layout``)
    or started and stopped (cluster tier, under the session cluster);
  - ``"own"``: a cluster of its own on free ports and a temporary state dir, never the
    shared one (cluster tier);
  - ``"exclusive"``: clusters of its own on the usual ports, so nothing else may run
    (its smoke test runs only when no local cluster is running; ``make bench`` runs these
    first, before it starts the shared cluster).

Optional: ``OWN_SMOKE_TEST = "tests/..."``, a test of its own that runs the smoke sizes
and checks more than the shape; the generic smoke test then leaves it to that one.

Helpers (``common``, ``suite``, ``faultproxy``, and ``fault_*``: rows of ``faults``) have
no ``main``.
"""

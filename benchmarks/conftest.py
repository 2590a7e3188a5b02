"""Benchmarks are not tests: they live outside ``testpaths`` and run only when asked for.

    pytest benchmarks --benchmark-group-by=group --benchmark-json=bench.json

Every case is built by the functions ``python -m stepplanner.bench`` uses, so the two measure the
same ledgers and planners.
"""

"""Performance benchmarks for posenc: every number is a ratio against peers measured in the same run.

Run all with ``make perf`` / ``posenc perf [--quick]``; each ``bench_*.py`` module also runs alone
(``python -m benchmarks.bench_rope --quick``). Timings never go into test asserts.
"""

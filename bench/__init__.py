"""Benchmarks of ledgerview side by side with what a user would pick instead; results in bench/RESULTS.md.

Run ``python -m bench --help``. See bench/README.md for what each workload measures and how.
"""

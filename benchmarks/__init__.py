"""Side-by-side benchmarks of graphsvc against the tools a user would pick instead (see run.py)."""

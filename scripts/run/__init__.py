"""What users run: sweeps (sweep.py), tables (table.py) and figures (plot.py) from result files, the round-time
benchmark (benchmark.py) and the refactor check of every algorithm's curve (curves.py)."""

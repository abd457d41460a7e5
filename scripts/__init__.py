"""Tools beside the library, by role: run/ (what users run: sweeps, tables, figures, benchmarks),
experiments/ (the docs' experiments: sweep files and the reports that turn their runs into tables) and dev/
(tools for developing the library: mutation testing, generated doc tables, one-off measurements). Each is run
as a file (``python scripts/run/sweep.py``); its folder's _paths.py finds the repository's code."""

"""Tools for developing the library: mutation testing (mutate.py), the docs' generated tables (docs_tables.py,
dp_coverage.py), the layout figures and one-off measurements behind statements in the docs."""

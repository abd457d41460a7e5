"""The docs' experiments: the sweep files (*.json) and the reports that turn their runs into the docs' tables,
exports and figures (benchmark, robustness, heterogeneous models, FedALA, privacy), and the GPU checks."""

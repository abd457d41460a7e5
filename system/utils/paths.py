"""Where the library's files are, importable without torch (the flag parser shows the defaults).

The folders a run reads splits from and writes results to default to ``dataset/`` and ``results/`` in the
repository; the environment variables ``PFL_DATASET_ROOT`` and ``PFL_RESULTS_DIR`` move those defaults (the
flags ``--dataset_root`` and ``--results_dir`` still win). The test suite points both at temporary folders,
so no test reads or writes the repository's own."""
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
GENERATORS_DIR = REPO_ROOT / "dataset"  # the generate_<Name>.py scripts
DATASET_ROOT = Path(os.environ.get("PFL_DATASET_ROOT") or GENERATORS_DIR)  # --dataset_root when not given
RESULTS_DIR = Path(os.environ.get("PFL_RESULTS_DIR") or REPO_ROOT / "results")  # --results_dir when not given
# Splits that can be generated offline with default settings when missing.
OFFLINE_GENERATORS = {"Digits": "generate_Digits.py", "Synthetic": "generate_Synthetic.py"}

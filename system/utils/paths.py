"""Where the library's files are, importable without torch (the flag parser shows the defaults)."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DATASET_ROOT = REPO_ROOT / "dataset"
RESULTS_DIR = REPO_ROOT / "results"  # --results_dir when not given
# Splits that can be generated offline with default settings when missing.
OFFLINE_GENERATORS = {"Digits": "generate_Digits.py", "Synthetic": "generate_Synthetic.py"}

"""Write docs/privacy.md's per-algorithm table from the servers' privacy declarations (``dp_support``).

    python scripts/dev/dp_coverage.py          # rewrite the table in place
    python scripts/dev/dp_coverage.py --check  # exit 1 when the file's table differs (tests/test_dp_registry.py)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401
DOC = REPO / "docs" / "privacy.md"
HEADER = "| algorithm | `-dp` (DP-SGD) |"


def expected_table() -> str:
    from flcore.registry import ALGORITHMS, get_server_class
    from utils.dp_support import coverage_table

    return coverage_table({name: get_server_class(name) for name in ALGORITHMS})


def split_doc(text: str) -> tuple[str, str, str]:
    """(before, the table, after) of docs/privacy.md."""
    start = text.index(HEADER)
    end = text.index("\n\n", start) + 1
    return text[:start], text[start:end], text[end:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when the table differs")
    args = p.parse_args(argv)
    from utils import fileio

    before, table, after = split_doc(fileio.read_text(DOC, "doc"))
    new = expected_table()
    if args.check:
        if table != new:
            print("docs/privacy.md's table differs from the declarations; run python scripts/dev/dp_coverage.py",
                  file=sys.stderr)
            return 1
        return 0
    fileio.replace_file(DOC, (before + new + after).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

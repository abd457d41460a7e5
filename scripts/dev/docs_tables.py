"""Write the docs' tables that are made from the code's own declarations, so that no list of algorithms is
kept by hand:

- docs/algorithms.md: one row per registered algorithm, from its server class (``table_row``; what a class
  does not declare comes from its docstring and its flags);
- docs/privacy.md: what each algorithm's ``-dp`` covers or refuses (``dp_support``);
- the README's table of the algorithms that take ``--client_models`` (``model_support``);
- docs/performance.md: which algorithms train under ``--executor batched`` (each client class's ``batch_state``).

    python scripts/dev/docs_tables.py          # rewrite the tables in place
    python scripts/dev/docs_tables.py --check  # exit 1 naming each table that differs (the suite runs this)
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if __name__ == "__main__":  # run as a file: _paths.py puts the repository's code on the search path
    import _paths  # noqa: F401

ALGORITHMS_DOC = REPO / "docs" / "algorithms.md"
ALGORITHMS_HEADER = "| name (-algo) | paper | family | flags | +ALA |\n|---|---|---|---|---|\n"


def own_flags(server_cls) -> list[tuple[str, object]]:
    """(flag, default) of each flag the algorithm adds to the common ones, its short spelling first."""
    import cli

    base = cli.base_parser()
    known = set(base._option_string_actions)
    server_cls.add_args(base)
    return [(a.option_strings[0], a.default) for a in base._actions
            if a.option_strings and not set(a.option_strings) & known]


def show(value) -> str:
    return "on" if value is True else "off" if value is False else str(value)


def algorithm_row(name: str, server_cls) -> str:
    """The row of one algorithm: its declared ``table_row``, else what its class says of itself (the
    paper from its docstring's second line, the family from ``personalized``, the flags and their defaults
    from its parser)."""
    row = vars(server_cls).get("table_row") or {}
    doc = (server_cls.__module__ and sys.modules[server_cls.__module__].__doc__ or "").strip().splitlines()
    paper = row.get("paper") or (doc[1].strip() if len(doc) > 1 else "—")
    family = row.get("family") or ("pFL" if server_cls.declares.personalized else "traditional FL")
    flags = row.get("flags") or ", ".join(f"`{f}` {show(d)}" for f, d in own_flags(server_cls)) or "—"
    ala = row.get("ala") or "—"
    cells = [name, paper, family, flags, ala]
    return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |\n"


def algorithms_table() -> str:
    from flcore.registry import ALGORITHMS, get_server_class

    return ALGORITHMS_HEADER + "".join(algorithm_row(n, get_server_class(n)) for n in ALGORITHMS)


README_ALGORITHMS_HEADER = "| -algo | paper | family | its own flags |\n|---|---|---|---|\n"


def readme_algorithms_table() -> str:
    """The README's short table: each algorithm's paper without its link, the first clause of its family and
    the names of its own flags (docs/algorithms.md has the whole row)."""
    from flcore.registry import ALGORITHMS, get_server_class

    rows = []
    for name in ALGORITHMS:
        cls = get_server_class(name)
        cells = algorithm_row(name, cls).strip().strip("|").split(" | ")
        paper = re.sub(r",?\s*\[[^\]]*\]\([^)]*\)", "", cells[1]).strip().rstrip(",")
        family = re.split(r";|\s\(", cells[2])[0].strip()
        flags = " ".join(f for f, _ in own_flags(cls)) or "—"
        rows.append(f"| {name} | {paper} | {family} | {flags} |\n")
    return README_ALGORITHMS_HEADER + "".join(rows)


def split_at_table(text: str, header: str) -> tuple[str, str, str]:
    """(before, the table starting with ``header``, after) of a markdown text."""
    start = text.index(header)
    end = text.find("\n\n", start)
    end = len(text) if end < 0 else end + 1
    return text[:start], text[start:end], text[end:]


def readme_models_table() -> tuple[Path, str, str]:
    from flcore.registry import ALGORITHMS, get_server_class
    from utils.model_support import support_table

    table = support_table({n: get_server_class(n) for n in ALGORITHMS})
    return REPO / "README.md", table.splitlines(keepends=True)[0], table + ("" if table.endswith("\n") else "\n")


def batched_table() -> tuple[Path, str, str]:
    from flcore.registry import ALGORITHMS, get_server_class
    from runtime.batched import TABLE_HEADER, batch_table

    table = batch_table({n: get_server_class(n).declares.client_class for n in ALGORITHMS})
    return REPO / "docs" / "performance.md", TABLE_HEADER, table


SECURITY_DOC = REPO / "docs" / "security.md"
BOUNDS_START, BOUNDS_END = "<!-- numeric flags: utils/bounds.py markdown() -->\n", "\n<!-- end of numeric flags -->"


def bounds_table() -> str:
    """docs/security.md's table of every numeric flag's accepted range (utils/bounds.py), over the common
    parser and every algorithm's."""
    import cli
    from flcore.registry import ALGORITHMS
    from utils import bounds

    return bounds.markdown([cli.base_parser(), *(cli.parser_for(name) for name in ALGORITHMS)])


def write_bounds(check: bool) -> bool:
    """Whether docs/security.md's numeric-flags table (between its markers) is current; rewrite it unless
    ``check``."""
    from utils import fileio

    text = fileio.read_text(SECURITY_DOC, "doc")
    start = text.index(BOUNDS_START) + len(BOUNDS_START)
    end = text.index(BOUNDS_END, start)
    new = bounds_table()
    if text[start:end] == new:
        return True
    if not check:
        fileio.replace_file(SECURITY_DOC, (text[:start] + new + text[end:]).encode())
    return False


def tables() -> list[tuple[Path, str, str]]:
    """(file, the table's header line, the table as the declarations make it) for every generated table."""
    from scripts.dev import dp_coverage

    return [(ALGORITHMS_DOC, ALGORITHMS_HEADER.splitlines(keepends=True)[0], algorithms_table()),
            (REPO / "README.md", README_ALGORITHMS_HEADER.splitlines(keepends=True)[0], readme_algorithms_table()),
            (dp_coverage.DOC, dp_coverage.HEADER, dp_coverage.expected_table()),
            readme_models_table(), batched_table()]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only compare; exit 1 when a table differs")
    args = p.parse_args(argv)
    from utils import fileio

    stale = []
    for path, header, table in tables():
        before, old, after = split_at_table(fileio.read_text(path, "doc"), header)
        if old != table:
            stale.append(path.relative_to(REPO))
            if not args.check:
                fileio.replace_file(path, (before + table + after).encode())
    if not write_bounds(args.check):
        stale.append(SECURITY_DOC.relative_to(REPO))
    if args.check and stale:
        print(f"{', '.join(map(str, stale))}: generated table(s) differ from the code's declarations; run "
              f"python scripts/dev/docs_tables.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The README's "Adding an algorithm" example is the library's own SCAFFOLD, verbatim, so it cannot rot."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_example_files_are_the_library_files():
    readme = (REPO / "README.md").read_text()
    blocks = {m.group(1): m.group(2) for m in re.finditer(r"```python\n# (system/\S+\.py)\n(.*?)```", readme, re.S)}
    for path in ("system/flcore/clients/clientscaffold.py", "system/flcore/servers/serverscaffold.py"):
        assert blocks.get(path) == (REPO / path).read_text(), path

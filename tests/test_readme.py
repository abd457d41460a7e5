"""The README's "Adding an algorithm" example is the library's own SCAFFOLD, verbatim, and the guide's
(docs/adding_an_algorithm.md) is FedNova, verbatim, so neither can rot; CI runs the README's two commands before
anything else."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_readme_example_files_are_the_library_files():
    readme = (REPO / "README.md").read_text()
    blocks = {m.group(1): m.group(2) for m in re.finditer(r"```python\n# (system/\S+\.py)\n(.*?)```", readme, re.S)}
    for path in ("system/flcore/clients/clientscaffold.py", "system/flcore/servers/serverscaffold.py"):
        assert blocks.get(path) == (REPO / path).read_text(), path


def test_the_guides_files_are_the_library_files():
    """docs/adding_an_algorithm.md shows FedNova's two files verbatim."""
    guide = (REPO / "docs" / "adding_an_algorithm.md").read_text()
    blocks = {m.group(1): m.group(2) for m in re.finditer(r"```python\n# (system/\S+\.py)\n(.*?)```", guide, re.S)}
    for path in ("system/flcore/clients/clientfednova.py", "system/flcore/servers/serverfednova.py"):
        assert blocks.get(path) == (REPO / path).read_text(), path


def test_ci_runs_the_readme_commands_first():
    """.ci/run's first two commands are the README's install line (its pip part) and its test command, in the
    README's quick-start block; the optional set comes after them."""
    quick = re.search(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1).splitlines()
    ci = [line for line in (REPO / ".ci/run").read_text().splitlines() if line.startswith("python3 ")]
    assert any(line.startswith(ci[0] + " ") or line == ci[0] for line in quick), ci[0]
    assert ci[1] in quick, ci[1]
    assert ci[0] == "python3 -m pip install -r requirements.txt" and "optional" in ci[2], ci

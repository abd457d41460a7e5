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
    """.ci/run reads the README's install line and test command from its quick-start block (what its ``awk``
    line prints is exactly those two lines) and runs them, in that order, before the optional set, in a
    fresh virtual environment in a temporary copy."""
    import subprocess

    quick = re.search(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S).group(1).splitlines()
    want = [line for line in quick if line.strip() and not line.startswith("#")]
    assert want[0].startswith("python3 -m pip install -r requirements.txt") and want[1] == "python3 -m pytest"
    ci = (REPO / ".ci/run").read_text()
    awk = next(line for line in ci.splitlines() if "awk" in line)
    program = re.search(r"awk '([^']*)'", awk).group(1)
    got = subprocess.run(["awk", program, str(REPO / "README.md")], capture_output=True, text=True, check=True)
    assert got.stdout.splitlines() == want
    order = [ci.index(s) for s in ('python3 -m venv "$work/venv"', 'bash -c "$install"', 'bash -c "$tests"',
                                   "pip install --quiet -r requirements-optional.txt", 'pytest -m "optional_deps or shared_data"')]
    assert order == sorted(order), order
    assert "--system-site-packages" not in ci


def test_the_testing_page_is_a_method_page_and_the_architecture_is_linked_from_the_top():
    """docs/testing.md stays within 400 lines (the per-mutant notes are generated into
    docs/mutation-survivors.md), and the README links docs/architecture.md before its first section."""
    assert len((REPO / "docs" / "testing.md").read_text().splitlines()) <= 400
    assert "<!-- mutation-survivors:begin -->" in (REPO / "docs" / "mutation-survivors.md").read_text()
    readme = (REPO / "README.md").read_text()
    assert "docs/architecture.md" in readme[:readme.index("\n## ")]

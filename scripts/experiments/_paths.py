"""How a script run as a file finds the repository's code, and the one place that changes the search path.

``python scripts/run/sweep.py`` (or ``python dataset/generate_MNIST.py``) puts only the script's own folder
on the search path. A script in this folder starts with

    if __name__ == "__main__":
        import _paths  # noqa: F401

which puts the repository's root there (the packages ``dataset`` and ``scripts``) and system/ (the library:
``utils``, ``flcore``, ``cli``, ``main``). Imported as a module (``from scripts.run import table``, as the
tests and other scripts do), a script leaves the path to whoever imports it. system/'s own entry points
need nothing: ``python system/main.py`` already has system/ on the path. Every copy of this file (dataset/,
scripts/run/, scripts/experiments/, scripts/dev/) is the same; tests/test_imports.py checks that, and that no
other module under system/, dataset/ or scripts/ edits the path.
"""
import sys
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "system" / "main.py").is_file())
for folder in (ROOT, ROOT / "system"):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

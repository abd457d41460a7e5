"""Every command the README and docs/ show runs as written, in parse-only form: its script exists, and its
flags parse under that script's own parser (main.py's also pass its checks), so a moved script or a renamed
flag fails here instead of in a reader's shell. Every file path under scripts/, system/ or dataset/ that the
docs name exists."""
from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
COMMAND = re.compile(r"^((?:\w+=\S*\s+)*)(python3?|bash)\s+((?:system|dataset|scripts)/\S+)(.*)$")
# NAME, FILE, ..., <out>, or a shell variable standing for several arguments ($common)
PLACEHOLDER = re.compile(r"^(\.\.\.|[A-Z][A-Z_]+|<[^>]*>|\$\w+)$|=NAME$")


def documented_commands() -> list[tuple[str, str]]:
    """(doc file, command line) for every command in a code block or an inline code span of the docs, line
    continuations joined and trailing comments dropped."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        lines = []
        for block in re.finditer(r"```(?:bash|sh|console|)\n(.*?)```", text, re.S):
            lines += block.group(1).replace("\\\n", " ").splitlines()
        lines += re.findall(r"`([^`\n]+)`", text)
        for line in lines:
            line = re.sub(r"\s+#.*$", "", line.strip())
            if COMMAND.match(line):
                found.append((doc.name, line))
    return sorted(set(found))


def documented_paths() -> list[tuple[str, str]]:
    """(doc file, path) of every file under scripts/, system/ or dataset/ the docs name."""
    pattern = re.compile(r"(?<![\w/.-])((?:scripts|system|dataset)/[\w./-]+\.(?:py|json|sh))\b")
    return sorted({(doc.name, m.group(1)) for doc in DOCS for m in pattern.finditer(doc.read_text())
                   if "NAME" not in m.group(1)})


COMMANDS = documented_commands()


def test_the_docs_show_commands_and_paths():
    assert len(COMMANDS) > 100 and len(documented_paths()) > 50


@pytest.mark.parametrize("doc, path", documented_paths())
def test_every_documented_path_exists(doc, path):
    assert (REPO / path).exists(), f"{doc} names {path}, which does not exist"


class Parsed(Exception):
    """Raised by the patched ``parse_args`` once a script's parser has accepted its arguments."""


def load(path: Path):
    """The script as a module, not as ``__main__``: its folder's _paths.py stays unused, the search path is
    the suite's (the root and system/, pytest.ini), as for a script another one imports."""
    name = f"documented_{path.parent.name}_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def parses(script: Path, args: list[str], monkeypatch) -> None:
    """Run the script's ``main(args)`` until its parser has read them (then stop): an unknown or renamed flag
    exits 2 there."""
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        result = original(self, args, namespace)
        raise Parsed(result)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    module = load(script)
    assert hasattr(module, "main"), f"{script} has no main(argv)"
    try:
        code = module.main(args)
    except Parsed:
        return
    except SystemExit as e:
        code = e.code
    assert code in (0, None), f"{script.name} {' '.join(args)}: exit {code}"  # --list, -h: done without parsing


@pytest.mark.parametrize("doc, command", COMMANDS)
def test_every_documented_command_parses(doc, command, monkeypatch, tmp_path, capsys):
    env, runner, path, rest = COMMAND.match(command).groups()
    if "NAME" in path:  # generate_NAME.py: the pattern of a command
        return
    script = REPO / path
    assert script.exists(), f"{doc}: {command}: {path} does not exist"
    args = shlex.split(rest)
    if any(PLACEHOLDER.search(a) for a in args):  # a pattern of a command, not one: the script exists
        return
    if runner == "bash":
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
        return
    if path == "system/main.py":
        import cli
        from utils.errors import FLError

        try:
            cli.parse_config(args)
        except SystemExit as e:
            assert e.code == 0, f"{doc}: {command}: {capsys.readouterr().err.strip()}"
        except FLError as e:
            # what only a run on that machine supplies: an optional package, a file the command names
            named = [a for a in args if not a.startswith("-") and not (REPO / a).exists()]
            assert "not installed" in str(e) or any(a in str(e) for a in named), f"{doc}: {command}: {e}"
        return
    monkeypatch.chdir(tmp_path)  # a script that writes before parsing writes here
    if path == "scripts/run/sweep.py":  # its own flags, then main.py's for every job: its dry run checks both
        code = load(script).main([*[a.replace("scripts/", f"{REPO}/scripts/", 1) for a in args], "--dry-run"])
        err = capsys.readouterr().err
        assert code == 0 or "not installed" in err, f"{doc}: {command}: {err.strip()}"
        return
    parses(script, args, monkeypatch)


def test_a_renamed_flag_or_moved_script_fails_the_check(monkeypatch, tmp_path, capsys):
    """The check itself: a flag the parser does not know exits 2 and fails it."""
    with pytest.raises(AssertionError, match="exit 2"):
        parses(REPO / "scripts" / "run" / "table.py", ["results", "--no-such-flag"], monkeypatch)
    assert not (REPO / "scripts" / "run" / "no_such_script.py").exists()

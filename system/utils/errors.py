"""The exceptions the command line turns into a single clear line (results so far are kept)."""


class FLError(RuntimeError):
    """A user-facing error: bad flag, unknown name, missing split, NaN loss. Its message says what to do."""


class Diverged(FLError):
    """Training produced a non-finite loss; the run's sidecar records status "diverged"."""


class Interrupted(FLError):
    """The run was stopped by Ctrl-C or SIGTERM; its message says what was kept and how to resume."""


def require(checks) -> None:
    """Raise FLError with the message of the first (condition, message) pair whose condition fails."""
    for ok, msg in checks:
        if not ok:
            raise FLError(msg)

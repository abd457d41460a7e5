"""The one exception type the command line turns into a single clear line (results so far are kept)."""


class FLError(RuntimeError):
    """A user-facing error: bad flag, unknown name, missing split, NaN loss. Its message says what to do."""

"""User-facing errors: the CLI prints their message on one line and exits with code 2."""


class DiscoError(Exception):
    """A problem the user can fix (bad input, missing file, mismatched pair).

    The message names the problem and the fix; the CLI shows it without a traceback.
    """

"""User-facing errors: the CLI prints their message on one line and exits with code 2."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


class DiscoError(Exception):
    """A problem the user can fix (bad input, missing file, mismatched pair).

    The message names the problem and the fix; the CLI shows it without a traceback.
    """


@contextmanager
def said_in_one_line() -> Iterator[None]:
    """Where a host program, not disco's CLI, reports what disco raises (vLLM's worker under `vllm serve`
    shows "Engine core initialization failed" and a traceback): a DiscoError raised inside is first printed
    as one line, `disco: MESSAGE`, on stderr, then goes on as it was. A context manager, or a decorator:
    `@said_in_one_line()`."""
    try:
        yield
    except DiscoError as e:
        print(f"disco: {e}", file=sys.stderr, flush=True)
        raise

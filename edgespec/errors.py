"""Errors a user can fix: printed as one line, exit code 2."""

from __future__ import annotations

import sys
from collections.abc import Callable


class EdgespecError(Exception):
    """A problem with the user's input or environment, reported as one clear line."""


class RequestError(EdgespecError):
    """A request that cannot be answered as asked: ``param`` names the field at fault (as
    the CLI's flag or the request body's field), ``code`` is a wire format's error code."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code


def run_reporting_errors(main: Callable[[], int]) -> int:
    """Run a command's body; what the user can fix becomes one line on stderr and exit
    code 2, Ctrl-C exit code 130, never a traceback."""
    try:
        return int(main() or 0)
    except EdgespecError as exc:
        print(f"edgespec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("edgespec: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head` and closed: not an error
        return 0

"""Errors a user can fix: printed as one line, exit code 2."""


class EdgespecError(Exception):
    """A problem with the user's input or environment, reported as one clear line."""

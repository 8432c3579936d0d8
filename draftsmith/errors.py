"""User-facing errors: the CLI prints their message on one line, without a traceback."""


class DraftsmithError(Exception):
    """A mistake in the user's input (a file, a field, a flag) that we can name clearly."""

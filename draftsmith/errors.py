"""User-facing errors: the CLI prints their message on one line, without a traceback."""


class DraftsmithError(Exception):
    """A mistake in the user's input (a file, a field, a flag) that we can name clearly."""


def user_error(e: BaseException | None) -> DraftsmithError | None:
    """The DraftsmithError that ``e`` is or was raised from (libraries such as jsonargparse and Lightning wrap
    them), if any."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, DraftsmithError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None

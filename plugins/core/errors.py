"""The one exception family of trtpipe.

Every error a user can cause derives from :class:`TrtpipeError`. It lives in ``plugins`` (the
lowest layer) so that ``runtime`` and ``pipeline`` can share it without import cycles.
"""


class TrtpipeError(Exception):
    """Base class of every user-facing trtpipe error (bad recipe, bad artifact, bad input)."""


class OpError(TrtpipeError, ValueError):
    """A custom op got inputs or attributes it cannot handle (shape, dtype, group size...)."""

"""Runtime errors; all derive from :class:`trtpipe.plugins.core.errors.TrtpipeError`."""

from trtpipe.plugins.core.errors import TrtpipeError


class ArtifactError(TrtpipeError):
    """An artifact directory is missing, corrupted, or built for another backend/target."""


class RequestError(TrtpipeError, ValueError):
    """A generation request is invalid (empty prompt, bad sampling parameters...). ``field`` names
    the request field at fault where one is (``prompt``, ``messages``, ``cache_salt``, a sampling
    field); ``code`` a machine-readable reason (``context_length_exceeded``), for the server's
    OpenAI error body."""

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None):
        super().__init__(message)
        self.field = field
        self.code = code


class StepError(TrtpipeError, ValueError):
    """A step batch handed to an engine is malformed (a length that is not T or S, a block id or
    slot outside the pool, a position past the rotary table...): refused before anything was
    read or written. ``field`` names the array at fault (``block_tables[0]``)."""

    def __init__(self, message: str, *, field: str):
        super().__init__(message)
        self.field = field


class MetricsError(TrtpipeError, ValueError):
    """Timing events out of order, or a metric asked of data that cannot define it."""


class KVLeakError(TrtpipeError):
    """KV blocks are still in use when every request has finished (a bug in trtpipe: some path
    did not free its blocks). Raised by :meth:`BlockPool.check_all_free`."""


__all__ = ["TrtpipeError", "ArtifactError", "RequestError", "StepError", "KVLeakError", "MetricsError"]

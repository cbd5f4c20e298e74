"""Runtime errors; all derive from :class:`trtpipe.plugins.errors.TrtpipeError`."""

from trtpipe.plugins.errors import TrtpipeError


class ArtifactError(TrtpipeError):
    """An artifact directory is missing, corrupted, or built for another backend/target."""


class RequestError(TrtpipeError, ValueError):
    """A generation request is invalid (empty prompt, bad sampling parameters...)."""


__all__ = ["TrtpipeError", "ArtifactError", "RequestError"]

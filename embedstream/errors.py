"""One error type for everything that has to say *what* went wrong to a machine and *why* to a person.

Replies, dead letters, HTTP error bodies and CLI exits all carry the same two fields, so every error
class the project raises on purpose (engine, vector store, decoding, CDC, planning, publishing,
re-indexing, the dev broker) derives from :class:`CodedError`: callers catch one type, and turn it into
the wire's ``ErrorInfo`` without knowing which part raised it.

This module imports nothing of the project, so any package (``embedstream.schemas`` included) can
subclass it without an import cycle.
"""

from __future__ import annotations


class CodedError(Exception):
    """An error with a stable machine-readable ``code`` and a ``message`` a person can act on.

    ``str(error)`` is the message alone (the code is for programs; log lines show both as fields).
    Subclasses whose code never varies set the class attribute ``code`` and take only a message,
    e.g. ``PlanError("--tokens must be a positive number")``.
    """

    code: str = "error"

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code!r}, message={self.message!r})"

    def __reduce__(self):
        # Rebuild through the base initialiser: subclasses may take other arguments, and a pickled
        # error (a worker subprocess reporting back) must keep both fields.
        return _rebuild, (type(self), self.code, self.message, self.__dict__)

    def to_info(self) -> dict[str, str]:
        """``{"code", "message"}``: the shape of the wire's ErrorInfo, for JSON bodies and log fields."""
        return {"code": self.code, "message": self.message}

    def to_error_info(self):
        """As carried in replies and dead letters (an ``embedstream.schemas.events.ErrorInfo``)."""
        from embedstream.schemas.events import ErrorInfo

        return ErrorInfo(code=self.code, message=self.message)


def _rebuild(cls: type[CodedError], code: str, message: str, state: dict) -> CodedError:
    error = cls.__new__(cls)
    CodedError.__init__(error, code, message)
    error.__dict__.update(state)
    return error

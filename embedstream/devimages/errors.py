"""The one error type of the engine set-up and the image builds."""

from __future__ import annotations

from embedstream.errors import CodedError


class DevImagesError(CodedError, RuntimeError):
    """The engine could not be set up or an image not built; the message says why (and which log to read)."""

    def __init__(self, message: str, code: str = "dev_images"):
        super().__init__(code, message)

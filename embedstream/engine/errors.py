"""Errors the engine reports per item (never for the whole batch) and at start-up."""

from __future__ import annotations

from embedstream.errors import CodedError


class EngineError(CodedError):
    """An error with a stable machine-readable code, carried to replies and dead letters."""

    def to_dict(self) -> dict:
        """The result JSON's ``error`` field (the CLI's ``embed``/``score`` output)."""
        return self.to_info()


class ConfigError(EngineError):
    """A configuration that cannot work: refused at start, never discovered as a hang later."""

    def __init__(self, message: str):
        super().__init__("bad_config", message)


class UnknownModelError(EngineError):
    def __init__(self, name: str, known: list[str]):
        super().__init__(
            "unknown_model",
            f"unknown model {name!r}: not in the registry ({', '.join(sorted(known)) or 'empty'}) and not a local folder",
        )

"""structlog set-up: JSON lines when stderr is not a terminal (production), pretty when it is."""

from __future__ import annotations

import logging
import sys

import structlog

_SECRET_KEYS = ("password", "api_key", "apikey", "secret", "credential", "auth_token", "access_token")


def _redact(_, __, event_dict: dict) -> dict:
    """Never let a credential reach a log line, whatever a caller passed."""
    for key in list(event_dict):
        if any(s in key.lower() for s in _SECRET_KEYS):
            event_dict[key] = "***"
    return event_dict


class _CurrentStderr:
    """Whatever sys.stderr is at write time: a stream captured at configure time may be closed
    later (test capture, a daemon re-opening its stderr), and a log call must never fail for that."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(json: bool | None = None, level: str = "INFO") -> None:
    json = (not sys.stderr.isatty()) if json is None else json
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),
        cache_logger_on_first_use=False,
    )


def get(name: str):
    return structlog.get_logger(name)


def console():
    """A rich Console for tables: as wide as the terminal, or 200 columns when piped to a file or CI log
    (rich's 80-column default squeezes benchmark tables into unreadable cells)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)

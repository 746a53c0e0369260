"""The one logging set-up: structlog, JSON lines when stderr is not a terminal (production), pretty when it is.

Our code logs through structlog (:func:`get`). Libraries log through the standard library (kafka-python,
httpx under qdrant-client, uvicorn); :func:`configure` routes those records through the same processors
and renderer, so a worker's stderr is one stream of one format, with credentials redacted either way.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

_SECRET_KEYS = ("password", "api_key", "apikey", "secret", "credential", "auth_token", "access_token")

#: Libraries whose INFO lines are per-connection chatter (kafka-python logs every broker connect,
#: metadata refresh and version probe): shown from WARNING, unless the configured level is DEBUG.
_CHATTY_LIBRARIES = ("kafka", "httpx", "httpcore")

#: Library records that are not the user's business, by logger and message start: demoted to DEBUG (kept
#: when the level is DEBUG, gone otherwise). kafka-python warns on every consumer made without a group
#: (the topic probes, the lag monitor) and when its IO loop waited for the GIL; torch on importing its flop
#: counter without triton (CPU hosts).
_DEMOTED = {
    "kafka.coordinator.consumer": ("group_id is None",),
    "torch.utils.flop_counter": ("triton not found",),
    "kafka.net.selector": ("Task ",),  # "... ran for 0.694s (>0.100s threshold)": its IO loop on a busy host
}

#: Extras libraries attach for their own formatters (uvicorn's ANSI-coloured copy of the message).
_FOREIGN_NOISE = ("color_message",)

_handler: logging.Handler | None = None  # ours on the root logger, replaced on every configure()
_threshold = logging.INFO  # the configured level (the demotion filter drops what falls below it)


class _Demote(logging.Filter):
    """Library records in ``_DEMOTED`` become DEBUG records: shown only when the level is DEBUG."""

    def __init__(self, starts: tuple[str, ...]):
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and str(record.msg).startswith(self.starts):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return _threshold <= logging.DEBUG
        return True


def _quiet_libraries() -> None:
    """Demote ``_DEMOTED``; no progress bars from transformers and huggingface_hub (loading a model's weights
    takes well under a second: a bar there is noise; the bars the user waits for are ours)."""
    for name, starts in _DEMOTED.items():
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, _Demote)]:
            logger.removeFilter(old)
        logger.addFilter(_Demote(starts))
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when they are imported
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()
    if "transformers" in sys.modules:
        sys.modules["transformers"].utils.logging.disable_progress_bar()


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


class _NamedPrintLogger(structlog.PrintLogger):
    """structlog's fast print logger, carrying the name it was asked for (``add_logger_name`` reads it)."""

    def __init__(self, name: str):
        super().__init__(_CurrentStderr())
        self.name = name


def _named_print_logger(*args: str) -> _NamedPrintLogger:
    return _NamedPrintLogger(args[0] if args else "")


def _drop_noise(_, __, event_dict: dict) -> dict:
    for key in _FOREIGN_NOISE:
        event_dict.pop(key, None)
    return event_dict


def _common_processors() -> list:
    return [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


def _renderers(json: bool) -> list:
    if json:  # tracebacks as text in the line; the console renderer formats exc_info itself
        return [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    # plain tracebacks: rich's default one prints every frame's locals, credentials included
    return [structlog.dev.ConsoleRenderer(colors=False, exception_formatter=structlog.dev.plain_traceback)]


def configure(json: bool | None = None, level: str = "INFO") -> None:
    """Set up structlog and route the standard library's records through the same renderer.

    Idempotent: a second call replaces the first one's handler (commands and tests call it again)."""
    global _handler, _threshold
    json = (not sys.stderr.isatty()) if json is None else json
    threshold = _threshold = getattr(logging, level.upper(), logging.INFO)
    structlog.configure(
        processors=[*_common_processors(), structlog.stdlib.add_logger_name, _redact, *_renderers(json)],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=_named_print_logger,
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(_CurrentStderr())
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*_common_processors(), structlog.stdlib.add_logger_name,
                           structlog.stdlib.ExtraAdder(), _drop_noise, _redact],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *_renderers(json)],
    ))
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    root.addHandler(handler)
    root.setLevel(threshold)
    _handler = handler
    chatty = threshold if threshold <= logging.DEBUG else max(threshold, logging.WARNING)
    for name in _CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(chatty)
    _quiet_libraries()


def get(name: str):
    """A structlog logger whose lines carry ``logger=name``, like the standard library's records."""
    return structlog.get_logger(name)


def console():
    """A rich Console for tables: as wide as the terminal, or 200 columns when piped to a file or CI log
    (rich's 80-column default squeezes benchmark tables into unreadable cells)."""
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200)

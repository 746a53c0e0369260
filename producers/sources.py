"""Documents to ingest, read from JSONL files, text/markdown files, folders of them, or stdin.

One bad line or unreadable file must not stop a bulk load: problems are collected as
``SourceError`` (``file:line: message``) and the rest is still yielded.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from embedstream.schemas.bounds import doc_id_refusal, metadata_refusal

JSONL_SUFFIXES = frozenset({".jsonl", ".ndjson", ".json-lines"})
TEXT_SUFFIXES = frozenset({".txt", ".md", ".markdown", ".rst"})
STDIN = "-"


@dataclass(frozen=True, slots=True)
class Document:
    """One document to chunk and publish; doc_id is the Kafka key and the unit of replacement."""

    doc_id: str
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def coerce(cls, value: Document | Mapping[str, Any]) -> Document:
        """Accept a Document or a mapping with doc_id/text[/metadata] (as read from JSON)."""
        if isinstance(value, Document):
            return value
        return cls(str(value["doc_id"]), value["text"], dict(value.get("metadata") or {}))


@dataclass(frozen=True, slots=True)
class SourceError:
    """A line or file that was skipped, and why."""

    path: str
    line: int | None
    message: str

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.message}"


class DocumentSource:
    """Iterates the documents under a path; ``errors`` lists what was skipped (filled while iterating).

    Accepted paths: a ``.jsonl``/``.ndjson``/``.json-lines`` file (one ``{"doc_id", "text", "metadata"?}``
    object per line), a ``.txt``/``.md``/``.markdown``/``.rst`` file (doc_id = its path relative to
    ``base``, metadata ``{"path": ...}``), a folder (walked recursively in sorted order, hidden entries
    skipped), or ``-`` for JSONL on stdin. ``base`` defaults to the folder itself, or a file's parent,
    so doc ids do not depend on the current directory.
    """

    def __init__(self, path: str | os.PathLike[str], base: str | os.PathLike[str] | None = None,
                 stdin: BinaryIO | None = None):
        self.path = path if path == STDIN else Path(path)
        self.base = Path(base) if base is not None else None
        self._stdin = stdin
        self.errors: list[SourceError] = []

    def __iter__(self) -> Iterator[Document]:
        if self.path == STDIN:
            stream = self._stdin if self._stdin is not None else sys.stdin.buffer
            yield from self._jsonl_lines(stream, "<stdin>")
            return
        path = Path(self.path)
        if path.is_dir():
            base = self.base or path
            for file in _walk(path):
                yield from self._file(file, base)
        elif path.is_file():
            yield from self._file(path, self.base or path.parent, explicit=True)
        else:
            self.errors.append(SourceError(str(path), None, "no such file or folder"))

    def _file(self, path: Path, base: Path, explicit: bool = False) -> Iterator[Document]:
        suffix = path.suffix.lower()
        try:
            if suffix in JSONL_SUFFIXES:
                with path.open("rb") as stream:
                    yield from self._jsonl_lines(stream, str(path))
            elif suffix in TEXT_SUFFIXES or explicit:
                yield from self._text_file(path, base)
        except OSError as exc:
            self.errors.append(SourceError(str(path), None, f"cannot read: {exc.strerror or exc}"))
        except UnicodeDecodeError as exc:
            self.errors.append(SourceError(str(path), None, f"not UTF-8 text ({exc.reason} at byte {exc.start})"))

    def _text_file(self, path: Path, base: Path) -> Iterator[Document]:
        try:
            doc_id = path.relative_to(base).as_posix()
        except ValueError:
            doc_id = path.as_posix()
        refused = doc_id_refusal(doc_id)
        if refused:  # e.g. a path deeper than the id limit, or a file name with a control character
            self.errors.append(SourceError(str(path), None, f"its path cannot be a doc_id: {refused}"))
            return
        yield Document(doc_id=doc_id, text=path.read_text(encoding="utf-8"), metadata={"path": str(path)})

    def _jsonl_lines(self, stream: Iterable[bytes], name: str) -> Iterator[Document]:
        for number, raw in enumerate(stream, start=1):
            if not raw.strip():
                continue
            try:
                yield parse_document(raw)
            except ValueError as exc:
                self.errors.append(SourceError(name, number, str(exc)))


def parse_document(raw: bytes | str) -> Document:
    """One JSONL line -> Document; ValueError with a short reason when it is not a valid document."""
    try:
        obj = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    doc_id, text, metadata = obj.get("doc_id"), obj.get("text"), obj.get("metadata")
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or doc_id == "":
        raise ValueError("doc_id is missing or not a non-empty string")
    if not isinstance(text, str):
        raise ValueError("text is missing or not a string")
    if metadata is not None and not isinstance(metadata, dict):
        raise ValueError("metadata must be an object")
    refused = doc_id_refusal(str(doc_id))
    if refused:
        raise ValueError(f"doc_id {refused}")
    refused = metadata_refusal(metadata or {})
    if refused:
        raise ValueError(f"metadata {refused}")
    return Document(doc_id=str(doc_id), text=text, metadata=metadata or {})


def iter_documents(path: str | os.PathLike[str], errors: list[SourceError] | None = None,
                   base: str | os.PathLike[str] | None = None) -> Iterator[Document]:
    """Function form of DocumentSource; skipped items are appended to ``errors`` when given."""
    source = DocumentSource(path, base=base)
    try:
        yield from source
    finally:
        if errors is not None:
            errors.extend(source.errors)


def _walk(root: Path) -> Iterator[Path]:
    """Supported files under root, depth-first in sorted order (deterministic doc order), hidden ones skipped."""
    suffixes = JSONL_SUFFIXES | TEXT_SUFFIXES
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if not name.startswith(".") and Path(name).suffix.lower() in suffixes:
                yield Path(folder, name)

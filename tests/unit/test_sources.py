"""Document sources: JSONL (bad lines reported, not fatal), text files, folders, stdin."""

from __future__ import annotations

import io
import json

import pytest

from embedstream.producers.sources import Document, DocumentSource, SourceError, iter_documents, parse_document


def _jsonl(path, rows: list) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")


def test_jsonl_good_and_bad_lines(tmp_path):
    path = tmp_path / "docs.jsonl"
    _jsonl(path, [
        {"doc_id": "a", "text": "first", "metadata": {"lang": "en"}},
        "{not json",
        "",
        {"doc_id": "", "text": "empty id"},
        {"doc_id": "c", "text": 5},
        [1, 2],
        {"doc_id": 7, "text": "numeric id"},
        {"doc_id": "d", "text": "x", "metadata": "oops"},
        {"doc_id": "e", "text": "last"},
    ])
    source = DocumentSource(path)
    docs = list(source)
    assert docs == [
        Document("a", "first", {"lang": "en"}),
        Document("7", "numeric id", {}),
        Document("e", "last", {}),
    ]
    where = [(e.path, e.line) for e in source.errors]
    assert where == [(str(path), 2), (str(path), 4), (str(path), 5), (str(path), 6), (str(path), 8)]
    messages = [str(e) for e in source.errors]
    assert messages[0].startswith(f"{path}:2: invalid JSON")
    assert "doc_id" in messages[1] and "text" in messages[2] and "object" in messages[3] and "metadata" in messages[4]


def test_jsonl_bad_utf8_line_is_skipped(tmp_path):
    path = tmp_path / "docs.ndjson"
    path.write_bytes(b'{"doc_id": "a", "text": "ok"}\n{"doc_id": "b", "text": "\xff"}\n{"doc_id": "c", "text": "ok"}\n')
    errors: list[SourceError] = []
    docs = list(iter_documents(path, errors))
    assert [d.doc_id for d in docs] == ["a", "c"]
    assert len(errors) == 1 and errors[0].line == 2 and "UTF-8" in errors[0].message


def test_text_and_markdown_files(tmp_path):
    (tmp_path / "note.md").write_text("# Title\n\nBody.", encoding="utf-8")
    docs = list(DocumentSource(tmp_path / "note.md"))
    assert docs == [Document("note.md", "# Title\n\nBody.", {"path": str(tmp_path / "note.md")})]


def test_folder_is_walked_recursively_in_sorted_order(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "deep").mkdir()
    (tmp_path / ".git").mkdir()
    (tmp_path / "a.txt").write_text("alpha", encoding="utf-8")
    (tmp_path / "b" / "guide.rst").write_text("rst text", encoding="utf-8")
    (tmp_path / "b" / "deep" / "more.json-lines").write_text('{"doc_id": "j1", "text": "from jsonl"}\n', encoding="utf-8")
    (tmp_path / "b" / "image.png").write_bytes(b"\x89PNG")
    (tmp_path / ".git" / "config.txt").write_text("hidden", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    source = DocumentSource(tmp_path)
    docs = list(source)
    assert [d.doc_id for d in docs] == ["a.txt", "b/guide.rst", "j1"]
    assert docs[1].metadata == {"path": str(tmp_path / "b" / "guide.rst")}
    assert len(source.errors) == 1 and "latin1.txt" in str(source.errors[0]) and "UTF-8" in str(source.errors[0])


def test_doc_ids_relative_to_base(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.txt").write_text("x", encoding="utf-8")
    assert [d.doc_id for d in DocumentSource(tmp_path / "sub", base=tmp_path)] == ["sub/x.txt"]
    assert [d.doc_id for d in DocumentSource(tmp_path / "sub" / "x.txt", base=tmp_path)] == ["sub/x.txt"]


def test_stdin_jsonl():
    stream = io.BytesIO(b'{"doc_id": "s1", "text": "hello"}\nnope\n')
    source = DocumentSource("-", stdin=stream)
    assert list(source) == [Document("s1", "hello", {})]
    assert [str(e) for e in source.errors] == ["<stdin>:2: invalid JSON: Expecting value at column 1"]


def test_missing_path_is_an_error_not_a_crash(tmp_path):
    errors: list[SourceError] = []
    assert list(iter_documents(tmp_path / "nope", errors)) == []
    assert "no such file" in str(errors[0])


def test_parse_document_and_coerce():
    assert parse_document('{"doc_id": "x", "text": "t", "metadata": null}') == Document("x", "t", {})
    with pytest.raises(ValueError, match="doc_id"):
        parse_document('{"doc_id": true, "text": "t"}')
    assert Document.coerce({"doc_id": 3, "text": "t"}) == Document("3", "t", {})


def test_documents_outside_the_wire_bounds_are_reported_not_published(tmp_path):
    """An id or metadata the events could not carry is a SourceError, never a failed publish mid-load."""
    path = tmp_path / "docs.jsonl"
    _jsonl(path, [
        {"doc_id": "x" * 1025, "text": "id too long"},
        {"doc_id": "a\u0000b", "text": "control character in the id"},
        {"doc_id": "deep", "text": "t", "metadata": {"a": {"b": {"c": {"d": {"e": 1}}}}}},
        {"doc_id": "big", "text": "t", "metadata": {"blob": "v" * 70_000}},
        {"doc_id": "ok", "text": "fine", "metadata": {"a": {"b": {"c": [1]}}}},
    ])
    source = DocumentSource(path)
    assert [d.doc_id for d in source] == ["ok"]
    assert [e.line for e in source.errors] == [1, 2, 3, 4]
    messages = [e.message for e in source.errors]
    assert messages[0].startswith("doc_id") and "1024" in messages[0]
    assert "control characters" in messages[1]
    assert messages[2].startswith("metadata") and "levels deep" in messages[2]
    assert "bytes" in messages[3]


def test_a_path_that_cannot_be_a_doc_id_is_reported(tmp_path):
    folder = tmp_path / "docs"
    (folder / "ok.md").parent.mkdir(parents=True)
    (folder / "ok.md").write_text("fine", encoding="utf-8")
    (folder / "bad\x01name.md").write_text("control character in the file name", encoding="utf-8")
    source = DocumentSource(folder)
    assert [d.doc_id for d in source] == ["ok.md"]
    assert len(source.errors) == 1 and "cannot be a doc_id" in source.errors[0].message

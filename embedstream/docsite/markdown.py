"""Markdown text for the generated pages: one way to put free text into a table cell."""

from __future__ import annotations


def cell(text: str) -> str:
    """Text for a Markdown table cell: outside code spans, pipes, emphasis characters and HTML-looking brackets
    are escaped (a code span keeps its text as is; docstrings' reST ``literals`` become code spans); line breaks
    are joined."""
    parts = " ".join(text.split()).replace("``", "`").split("`")
    for i in range(0, len(parts), 2):  # even parts are outside backticks
        parts[i] = (parts[i].replace("\\", "\\\\").replace("<", "&lt;").replace("*", "\\*").replace("_", "\\_")
                    .replace("|", "\\|"))
    return "`".join(parts)

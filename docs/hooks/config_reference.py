"""MkDocs hook: the configuration reference's tables, generated from the settings model at build time.

reference/configuration.md holds the prose and a marker; the marker becomes one table per settings section
(``embedstream.docsite.settings_reference.render_markdown``), so the page always says what the code reads.
"""

from __future__ import annotations

from mkdocs.exceptions import PluginError

from embedstream.docsite.settings_reference import render_markdown

PAGE = "reference/configuration.md"
MARKER = "<!-- settings-reference -->"


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise PluginError(f"{PAGE} lost its marker {MARKER}: the generated settings tables have no place")
    return markdown.replace(MARKER, render_markdown())

"""MkDocs hook: the HTTP API page (reference/http-api.md), generated from the gateway's OpenAPI document.

Off until ``embedstream.gateway.openapi.openapi_document()`` is on this branch. To turn it on, add this file
under ``hooks:`` in mkdocs.yml and ``- HTTP API: reference/http-api.md`` under the Reference section of ``nav``.
"""

from __future__ import annotations

from mkdocs.structure.files import File

from embedstream.docsite.http_api import render_openapi

PAGE = "reference/http-api.md"


def on_files(files, config, **kwargs):
    from embedstream.gateway.openapi import openapi_document

    files.append(File.generated(config, PAGE, content=render_openapi(openapi_document())))
    return files

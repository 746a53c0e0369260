"""The documentation site's generated pages: the configuration reference and the HTTP API."""

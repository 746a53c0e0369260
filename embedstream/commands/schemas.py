"""`embedstream schemas export`: JSON Schema of the wire models, for producers in other languages."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, help="Wire schemas.")


@app.command("export")
def schemas_export(directory: str = typer.Argument(..., help="Output folder for <Name>.schema.json files")) -> None:
    """Write the JSON Schema of every wire model, for producers in other languages."""
    from embedstream.schemas.export import export_json_schemas

    for path in export_json_schemas(directory):
        typer.echo(str(path))

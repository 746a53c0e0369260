"""`embedstream dev compose up|down|env|status` (the container engine) and `embedstream dev images build|list`
(every image of docker-compose.yml without a registry): embedstream/devimages/."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, List, Optional

import typer

compose_app = typer.Typer(no_args_is_help=True, help="The container engine `docker compose` talks to: a Docker "
                                                     "engine where one runs, else rootful podman set up here.")
images_app = typer.Typer(no_args_is_help=True, help="Every image of docker-compose.yml, built from the Debian "
                                                    "mirror and the package registries (no image registry).")


@compose_app.command("up")
def compose_up() -> None:
    """Use the Docker engine that answers; else install podman (apt-get), build the Docker Compose plugin
    (Go module proxy, once), serve podman's Docker API on /run/docker.sock and drive healthchecks."""
    from embedstream.devimages import engine

    typer.echo(engine.start())
    typer.echo('then: eval "$(embedstream dev compose env)"; embedstream dev images build; '
               "docker compose up -d --build --wait")


@compose_app.command("down")
def compose_down() -> None:
    """Stop the podman service and the healthcheck driver this machine's `up` started (containers are left:
    `docker compose down` stops those first)."""
    from embedstream.devimages import engine

    typer.echo("stopped" if engine.stop() else "not running")


@compose_app.command("env")
def compose_env() -> None:
    """Shell lines for `eval "$(embedstream dev compose env)"`: the engine's address, podman's configuration,
    and the wheelhouse the project image's `docker compose build` installs from."""
    from embedstream.devimages import engine, images

    lines = engine.env_lines() + [f"export {k}={v}" for k, v in images.compose_build_env().items()]
    typer.echo("\n".join(lines))


@compose_app.command("status")
def compose_status() -> None:
    """The engine's state as JSON; exit 3 when none answers."""
    from embedstream.devimages import engine

    state = engine.status()
    typer.echo(json.dumps(state, indent=2))
    raise typer.Exit(0 if state["answering"] else 3)


QdrantBinary = Annotated[Optional[Path], typer.Option(
    "--qdrant-binary", help="Qdrant server binary for the qdrant image (default: $EMBEDSTREAM_QDRANT_BINARY, else "
                            "~/.cache/embedstream/qdrant/<version>/qdrant): Qdrant's release archive for Linux "
                            "x86_64, or one built following Qdrant's build instructions")]


@images_app.command("build")
def images_build(
    names: Annotated[Optional[List[str]], typer.Argument(help="Images to build (default: all); what they need "
                                                              "is built first when missing")] = None,
    qdrant_binary: QdrantBinary = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Rebuild every layer (a cold build)")] = False,
) -> None:
    """Build the images and print a table of build seconds and sizes; exit 1 when one failed (the others are
    still built)."""
    from embedstream.devimages import images

    opts = images.Options(no_cache=no_cache)
    if qdrant_binary is not None:
        opts.qdrant_binary = qdrant_binary
    results = images.build_images(names or None, opts, echo=typer.echo)
    typer.echo(images.table(results))
    raise typer.Exit(1 if any(r.error for r in results) else 0)


@images_app.command("list")
def images_list() -> None:
    """Each image's tag, whether it exists and its size."""
    from embedstream.devimages import images

    results = [images.Result(i.name, i.tag(), None, images.image_size(i.tag()))
               for i in images.images(images.Options()).values()]
    typer.echo(images.table(results).replace("| ok |", "| built |"))

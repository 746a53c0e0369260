"""Containers without a registry: the container engine of a Debian machine without Docker (rootful podman,
Docker Compose built from its Go module, podman's Docker API socket, a healthcheck driver), and every
image of ``docker-compose.yml`` built from the Debian mirror and the package registries
(``embedstream dev compose ...``, ``embedstream dev images ...``; compose/README.md)."""

"""``python -m embedstream.gateway``: the gateway without the rest of the CLI (benchmarks start it this way)."""

from embedstream.gateway.cli import main

main()

"""The command groups of the `embedstream` CLI, one module each; ``embedstream.cli`` assembles them."""

"""``python -m embedstream.devkafka ...``: see cli.py."""

import sys

from embedstream.devkafka.cli import main

sys.exit(main())

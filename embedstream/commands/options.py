"""Options that several commands share, declared once so their names, defaults and help agree."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

#: The local dev broker (`embedstream dev kafka`), which the demo and the Kafka benchmarks start when it
#: is not running and reuse when it is.
BrokerPort = Annotated[int, typer.Option("--port", help="Port of the local broker on 127.0.0.1")]
BROKER_PORT = 9092

#: Where the local broker keeps its KRaft storage and logs.
BrokerDataDir = Annotated[
    Optional[str], typer.Option("--data-dir", help="Broker storage folder (default: $EMBEDSTREAM_KAFKA_DATA_DIR, else ~/.cache/embedstream/kafka-data/PORT)")
]

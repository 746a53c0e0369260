"""A checked, tokenised request waiting for a batch: what the engine, its sparse encoders and the workers pass on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from embedstream.engine.tokenize import Tokenized


@dataclass
class Prepared:
    """A checked, tokenised request waiting for a batch."""

    request: Any
    tokens: Tokenized
    normalize: bool = True

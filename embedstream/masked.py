"""Secrets handed to client libraries that log their configuration."""

from __future__ import annotations


class MaskedSecret(str):
    """A password handed to a Kafka client library: the string itself, but ``repr`` shows ``'***'``.

    kafka-python's admin client logs its whole configuration at DEBUG ("Starting KafkaAdminClient with
    configuration: {...}"), which printed ``sasl_plain_password`` in the clear; dicts render their values
    with ``repr``, so this keeps the secret out of such lines while the SASL code still reads the value.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return "'***'"

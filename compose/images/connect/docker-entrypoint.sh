#!/bin/bash
# `start` (the default command) runs a distributed Kafka Connect worker configured from the environment,
# as quay.io/debezium/connect does:
#   BOOTSTRAP_SERVERS, GROUP_ID (default 1), CONFIG_STORAGE_TOPIC, OFFSET_STORAGE_TOPIC, STATUS_STORAGE_TOPIC
#   (required), CONFIG_/OFFSET_/STATUS_STORAGE_REPLICATION_FACTOR (default 1), KEY_CONVERTER and
#   VALUE_CONVERTER (default JsonConverter), REST_PORT (8083), ADVERTISED_HOST_NAME (the container's
#   address), HEAP_OPTS; and every CONNECT_<NAME> variable is the worker property <name> (CONNECT_
#   stripped, lower case, "_" -> "."). Any other command runs as given.
set -euo pipefail
if [ "${1:-start}" != "start" ]; then exec "$@"; fi
for v in BOOTSTRAP_SERVERS CONFIG_STORAGE_TOPIC OFFSET_STORAGE_TOPIC STATUS_STORAGE_TOPIC; do
  if [ -z "${!v:-}" ]; then echo "error: $v must be set" >&2; exit 1; fi
done
config=/kafka/config/connect-distributed.properties
{
  echo "# Written by the image's entrypoint from the environment on every start."
  echo "bootstrap.servers=$BOOTSTRAP_SERVERS"
  echo "group.id=${GROUP_ID:-1}"
  echo "config.storage.topic=$CONFIG_STORAGE_TOPIC"
  echo "offset.storage.topic=$OFFSET_STORAGE_TOPIC"
  echo "status.storage.topic=$STATUS_STORAGE_TOPIC"
  echo "config.storage.replication.factor=${CONFIG_STORAGE_REPLICATION_FACTOR:-1}"
  echo "offset.storage.replication.factor=${OFFSET_STORAGE_REPLICATION_FACTOR:-1}"
  echo "status.storage.replication.factor=${STATUS_STORAGE_REPLICATION_FACTOR:-1}"
  echo "key.converter=${KEY_CONVERTER:-org.apache.kafka.connect.json.JsonConverter}"
  echo "value.converter=${VALUE_CONVERTER:-org.apache.kafka.connect.json.JsonConverter}"
  echo "listeners=http://0.0.0.0:${REST_PORT:-8083}"
  echo "rest.advertised.host.name=${ADVERTISED_HOST_NAME:-$(hostname -i | cut -d' ' -f1)}"
  echo "rest.advertised.port=${ADVERTISED_PORT:-${REST_PORT:-8083}}"
  echo "plugin.path=/kafka/connect"
  echo "offset.flush.interval.ms=${OFFSET_FLUSH_INTERVAL_MS:-60000}"
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    name="${line%%=*}"; key="${name#CONNECT_}"; key="${key,,}"; printf '%s=%s\n' "${key//_/.}" "${line#*=}"
  done <<< "$(env | grep -E '^CONNECT_[A-Z0-9_]+=' || true)"
} > "$config"
echo "Kafka Connect ${KAFKA_VERSION:-} with Debezium ${DEBEZIUM_VERSION:-}: $config"
exec java ${HEAP_OPTS:--Xms256M -Xmx1G} -XX:+UseG1GC -Djava.awt.headless=true \
  -Dlog4j2.configurationFile=/kafka/log4j2.properties ${KAFKA_OPTS:-} \
  -cp "/kafka/libs/*" org.apache.kafka.connect.cli.ConnectDistributed "$config"

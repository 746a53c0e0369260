#!/bin/bash
# The broker's start, with the environment conventions of the upstream apache/kafka image:
# - every KAFKA_<NAME> variable (but the JVM and log settings below) is the server property <name>:
#   KAFKA_ stripped, lower case, "___" -> "-", "__" -> "_", "_" -> "."
#   (KAFKA_LISTENER_SECURITY_PROTOCOL_MAP -> listener.security.protocol.map);
# - without any, a single-node KRaft broker and controller on :9092 / :9093;
# - CLUSTER_ID formats the storage the first time (a fixed id when unset); a formatted log dir is kept.
# A command given to the container runs instead of the broker (e.g. a tool under /opt/kafka/bin).
set -euo pipefail
if [ "$#" -gt 0 ]; then exec "$@"; fi

config=/opt/kafka/config/server.properties
not_props='^KAFKA_(VERSION|HEAP_OPTS|OPTS|LOG4J_OPTS|JMX_OPTS|JMX_PORT|JMX_HOSTNAME|JVM_PERFORMANCE_OPTS|GC_LOG_OPTS|LOG4J_ROOT_LOGLEVEL|LOG4J_LOGGERS|TOOLS_LOG4J_LOGLEVEL|DEBUG|HOME)='
props="$(env | grep -E '^KAFKA_[A-Z0-9_]+=' | grep -Ev "$not_props" || true)"
{
  echo "# Written by the image's entrypoint from the KAFKA_* environment on every start."
  if [ -z "$props" ]; then
    cat <<'DEFAULTS'
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@localhost:9093
listeners=PLAINTEXT://:9092,CONTROLLER://:9093
advertised.listeners=PLAINTEXT://localhost:9092
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
DEFAULTS
  fi
  while IFS= read -r line; do
    [ -n "$line" ] || continue
    name="${line%%=*}"; value="${line#*=}"
    key="${name#KAFKA_}"; key="${key,,}"; key="${key//___/-}"; key="${key//__/@}"; key="${key//_/.}"; key="${key//@/_}"
    printf '%s=%s\n' "$key" "$value"
  done <<< "$props"
} > "$config"
grep -q '^log.dirs=' "$config" || echo "log.dirs=/var/lib/kafka/data" >> "$config"

log_dir="$(sed -n 's/^log.dirs=//p' "$config" | cut -d, -f1)"
if [ ! -f "$log_dir/meta.properties" ]; then
  echo "formatting $log_dir (cluster id ${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw})"
  KAFKA_HEAP_OPTS=-Xmx256m /opt/kafka/bin/kafka-storage.sh format --ignore-formatted \
    --cluster-id "${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}" --config "$config"
fi
export KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xmx1G -Xms256m}"
export KAFKA_LOG4J_OPTS="${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties}"
export KAFKA_JVM_PERFORMANCE_OPTS="${KAFKA_JVM_PERFORMANCE_OPTS:--server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true}"
exec /opt/kafka/bin/kafka-run-class.sh kafka.Kafka "$config"

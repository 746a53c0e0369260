#!/bin/bash
# Runs a Kafka class on the image's jars: kafka-run-class.sh CLASS [ARGS...]
# KAFKA_HEAP_OPTS, KAFKA_OPTS, KAFKA_LOG4J_OPTS as in Apache Kafka's own scripts.
set -euo pipefail
class="$1"; shift
exec java ${KAFKA_HEAP_OPTS:--Xmx256m} ${KAFKA_JVM_PERFORMANCE_OPTS:--XX:+UseG1GC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true} \
  ${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=/opt/kafka/config/tools-log4j2.properties} ${KAFKA_OPTS:-} \
  -cp "/opt/kafka/libs/*" "$class" "$@"

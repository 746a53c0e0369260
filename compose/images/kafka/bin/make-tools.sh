#!/bin/bash
# Writes /opt/kafka/bin/<tool>.sh for each line "tool class" below: the command line tools the upstream
# image has under the same names (compose/README.md uses kafka-topics.sh and kafka-consumer-groups.sh,
# docker-compose.yml's healthcheck kafka-broker-api-versions.sh).
set -euo pipefail
while read -r tool class; do
  [ -n "$tool" ] || continue
  printf '#!/bin/bash\nexec /opt/kafka/bin/kafka-run-class.sh %s "$@"\n' "$class" > "/opt/kafka/bin/$tool.sh"
  chmod 0755 "/opt/kafka/bin/$tool.sh"
done <<'TOOLS'
kafka-topics org.apache.kafka.tools.TopicCommand
kafka-consumer-groups org.apache.kafka.tools.consumer.group.ConsumerGroupCommand
kafka-broker-api-versions org.apache.kafka.tools.BrokerApiVersionsCommand
kafka-configs kafka.admin.ConfigCommand
kafka-console-producer org.apache.kafka.tools.ConsoleProducer
kafka-console-consumer org.apache.kafka.tools.consumer.ConsoleConsumer
kafka-storage kafka.tools.StorageTool
kafka-metadata-quorum org.apache.kafka.tools.MetadataQuorumCommand
kafka-get-offsets org.apache.kafka.tools.GetOffsetShell
kafka-acls org.apache.kafka.tools.AclCommand
TOOLS

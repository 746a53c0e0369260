"""The local CDC rig: a throwaway PostgreSQL cluster (``postgres``) and a Kafka Connect worker with the
Debezium PostgreSQL connector (``connect``), built on the dev broker's jars, JVM and process handling."""

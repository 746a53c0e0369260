#!/usr/bin/env bash
# Set up and run the whole test suite (starts its own local Kafka broker, and for tests/cdc/ its own
# PostgreSQL and Kafka Connect with Debezium; no other services needed).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/postgres.sh"
venv="$(bash "$root/scripts/env.sh")"
cd "$root"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$venv/bin/python" -m pytest -q -p no:warnings "$@"

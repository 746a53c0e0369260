#!/usr/bin/env bash
# Set up and run the main job end to end: local Kafka broker, embed worker, embedded Qdrant,
# bulk indexing of a sample corpus, queries by request-reply.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$(bash "$root/scripts/env.sh")"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec "$venv/bin/embedstream" demo "$@"

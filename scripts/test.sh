#!/usr/bin/env bash
# Set up and run the whole test suite (starts its own local Kafka broker, and for tests/cdc/ its own
# PostgreSQL and Kafka Connect with Debezium; tests/compose/ sets up the container engine, builds the images
# from the caches and runs the docker compose stack). Whatever the run starts dies with
# it, even when it is killed (embedstream/devkafka/leash.py). When the run fails, the evidence of a native
# crash or a hang is printed (tests/run_rig.py): the faulthandler stacks, the test that was running, py-spy
# dumps of tests that ran long, core dumps.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/postgres.sh"
venv="$(bash "$root/scripts/env.sh")"
cd "$root"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
run_dir="${EMBEDSTREAM_TEST_RUN_DIR:-${TMPDIR:-/tmp}/embedstream-test-run-${EMBEDSTREAM_TEST_KAFKA_PORT:-19092}}"
export EMBEDSTREAM_TEST_RUN_DIR="$run_dir"
mkdir -p "$run_dir" && rm -f "$run_dir"/faults-*.log "$run_dir"/progress-*.log "$run_dir"/hang-*.txt
ulimit -c unlimited 2>/dev/null || ulimit -c "$(ulimit -H -c)" 2>/dev/null || true
marker="$run_dir/started"
touch "$marker"
status=0
# -rfEs: the summary lists every failure, error and skip with its reason (a skip is a part left out by name:
# EMBEDSTREAM_TEST_LEAVE_OUT, tests/parts.py; a missing real part fails instead).
"$venv/bin/python" -m pytest -q -p no:warnings -rfEs "$@" || status=$?
if [ "$status" -ne 0 ]; then
  if [ "$status" -gt 128 ]; then
    echo "embedstream: the test process died of signal $((status - 128)) (exit $status)" >&2
  fi
  for f in "$run_dir"/faults-*.log; do
    [ -s "$f" ] && { echo "---- $f (faulthandler: every thread's stack) ----" >&2; cat "$f" >&2; }
  done
  for f in "$run_dir"/progress-*.log; do
    [ -f "$f" ] || continue
    last="$(tail -n 1 "$f")"
    case "$last" in *" start "*) echo "---- running when it ended ($f): $last" >&2 ;; esac
  done
  for f in "$run_dir"/hang-*.txt; do
    [ -f "$f" ] && echo "---- stack dump of a test that ran long: $f" >&2
  done
  find "$root" -maxdepth 1 -name 'core*' -type f -newer "$marker" 2>/dev/null | while read -r core; do
    echo "---- core dump: $core" >&2
    if command -v gdb >/dev/null; then
      gdb -batch -iex "set auto-load python-scripts off" -ex "bt 40" -ex "thread apply all bt 12" "$venv/bin/python" "$core" 2>/dev/null | grep -v '^\[New LWP' | head -400 >&2 || true
    fi
  done
fi
exit "$status"

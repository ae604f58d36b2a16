#!/usr/bin/env bash
# Runs one step of `make test` (or `make demo`) and says how long it took:
#
#   hack/step.sh [--quiet] <step> <command> [args...]
#
# Prints `step <step>: <seconds> s` (and `failed, exit <rc>` when it did) on stderr when the command
# ends. With --quiet the command's own output (compilers, pip, apt: pages a new user reads as
# failures) goes to logs/<step>.log beside the steps file (build/logs/<step>.log) instead, one line says so when the step starts, and a
# failed step prints that log's last 40 lines. Either way the step is appended as one JSON line to
# ${GPUSCHED_STEP_LOG:-build/steps.jsonl} (relative to the repository root):
#   {"run": "<GPUSCHED_RUN_ID>", "step": "<step>", "started": "<UTC ISO 8601>", "seconds": 12.3, "rc": 0}
# so a cold run's record can be compared step by step with a warm one (`hack/steps_report.py`, printed at the end of `make test`).
# Exits with the command's own status. A step name is a word of [a-z0-9-]: it is written unquoted.
set -euo pipefail

quiet=false
if [[ "${1:-}" == --quiet ]]; then quiet=true; shift; fi
[[ $# -ge 2 ]] || { echo "usage: hack/step.sh [--quiet] <step> <command> [args...]" >&2; exit 2; }
step="$1"
shift
[[ "$step" =~ ^[a-z0-9-]+$ ]] || { echo "error: step name '$step' must be lowercase letters, digits and '-'" >&2; exit 2; }
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
log="${GPUSCHED_STEP_LOG:-$repo/build/steps.jsonl}"
run="${GPUSCHED_RUN_ID:-adhoc}"
[[ "$run" =~ ^[A-Za-z0-9T:._-]+$ ]] || { echo "error: GPUSCHED_RUN_ID '$run' must be letters, digits and ':._-'" >&2; exit 2; }

started_utc="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
started="$(date +%s%N)"
rc=0
if $quiet; then
  output="$(dirname "$log")/logs/$step.log"
  shown="${output#"$repo/"}"
  mkdir -p "$(dirname "$output")"
  echo "step $step: running (its output: $shown)" >&2
  "$@" >"$output" 2>&1 || rc=$?
else
  "$@" || rc=$?
fi
seconds="$(( ($(date +%s%N) - started) / 100000000 ))"   # tenths of a second
seconds="$((seconds / 10)).$((seconds % 10))"

if ((rc == 0)); then
  echo "step $step: $seconds s" >&2
else
  echo "step $step: $seconds s, failed, exit $rc" >&2
  if $quiet; then
    echo "--- the last 40 lines of $shown:" >&2
    tail -n 40 "$output" >&2
  fi
fi
mkdir -p "$(dirname "$log")"
printf '{"run": "%s", "step": "%s", "started": "%s", "seconds": %s, "rc": %d}\n' \
  "$run" "$step" "$started_utc" "$seconds" "$rc" >>"$log"
exit "$rc"

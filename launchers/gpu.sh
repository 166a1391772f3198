#!/usr/bin/env bash
# Run roleagent_jax on one host with N GPUs: one process drives all of them through one
# (data, fsdp, tensor) mesh. Restarts after a crash resume from the run's orbax checkpoints.
# See docs/scaling.md for the worked Qwen2.5-1.5B-Instruct ALFWorld example.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: launchers/gpu.sh [options] [-- TRAINER ARGS...]

  --gpus N               GPUs to use (default: all that nvidia-smi lists)
  --mesh D,F,T           data,fsdp,tensor sizes (default: 1,N,1 = FSDP over every GPU)
  --config FILE          trainer config (default: configs/alfworld.py)
  --workdir PATH         run directory: checkpoints, logs, report (default: the config's)
  --model-path PATH      Hugging Face model directory (sets --config.model.path)
  --alfworld-data PATH   ALFWorld games (default: $ALFWORLD_DATA, else ~/.cache/alfworld)
  --python PATH          interpreter (default: python3 on PATH)
  --install              first `pip install -e . "jax[cuda12]==0.10.2"` into that interpreter
  --jax-extra SPEC       the jax install spec for --install (default: "jax[cuda12]==0.10.2")
  --mem-fraction F       share of each GPU's memory JAX may take (default: 0.92)
  --max-restarts N       rerun (resuming) this many times when the trainer exits non-zero (default: 0)
  --log FILE             also append the output here (default: <workdir or logs>/train.log)
  --dry-run              print the environment and commands instead of running them
  -h, --help             this help

Everything after `--` is passed to `python -m roleagent_jax.main`, e.g. -- --config.iterations=150
EOF
}

GPUS="" MESH="" CONFIG="configs/alfworld.py" WORKDIR="" MODEL_PATH="" DATA="${ALFWORLD_DATA:-}"
PYTHON="python3" INSTALL=0 JAX_EXTRA="jax[cuda12]==0.10.2" MEM_FRACTION="0.92" MAX_RESTARTS=0 LOG=""
DRY_RUN=0
TRAINER_ARGS=()

need() { [[ $# -ge 2 && -n "$2" ]] || { echo "error: $1 needs a value (see --help)" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --gpus) need "$@"; GPUS="$2"; shift 2 ;;
    --mesh) need "$@"; MESH="$2"; shift 2 ;;
    --config) need "$@"; CONFIG="$2"; shift 2 ;;
    --workdir) need "$@"; WORKDIR="$2"; shift 2 ;;
    --model-path) need "$@"; MODEL_PATH="$2"; shift 2 ;;
    --alfworld-data) need "$@"; DATA="$2"; shift 2 ;;
    --python) need "$@"; PYTHON="$2"; shift 2 ;;
    --install) INSTALL=1; shift ;;
    --jax-extra) need "$@"; JAX_EXTRA="$2"; shift 2 ;;
    --mem-fraction) need "$@"; MEM_FRACTION="$2"; shift 2 ;;
    --max-restarts) need "$@"; MAX_RESTARTS="$2"; shift 2 ;;
    --log) need "$@"; LOG="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; TRAINER_ARGS=("$@"); break ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [[ -z "$GPUS" ]]; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    GPUS="$(nvidia-smi --list-gpus | wc -l)"
  elif (( DRY_RUN )); then
    GPUS=8
  else
    echo "error: nvidia-smi not found; pass --gpus N" >&2; exit 2
  fi
fi
[[ "$GPUS" =~ ^[1-9][0-9]*$ ]] || { echo "error: --gpus must be a positive number, got '$GPUS'" >&2; exit 2; }
[[ "$MAX_RESTARTS" =~ ^[0-9]+$ ]] || { echo "error: --max-restarts must be a number" >&2; exit 2; }
MESH="${MESH:-1,$GPUS,1}"
IFS=, read -r M_DATA M_FSDP M_TENSOR <<<"$MESH"
for v in "$M_DATA" "$M_FSDP" "$M_TENSOR"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "error: --mesh must be three positive sizes data,fsdp,tensor, got '$MESH'" >&2; exit 2; }
done
if (( M_DATA * M_FSDP * M_TENSOR != GPUS )); then
  echo "error: mesh $MESH uses $((M_DATA * M_FSDP * M_TENSOR)) devices but --gpus is $GPUS" >&2; exit 2
fi
DATA="${DATA:-$HOME/.cache/alfworld}"
LOG="${LOG:-${WORKDIR:-logs}/train.log}"

# One process, all local GPUs. The latency-hiding scheduler overlaps FSDP's all-gathers with compute;
# the memory fraction leaves room for NCCL and the CUDA context next to JAX's preallocated pool.
export CUDA_VISIBLE_DEVICES="$(seq -s, 0 $((GPUS - 1)))"
export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_gpu_enable_latency_hiding_scheduler=true"
export XLA_PYTHON_CLIENT_MEM_FRACTION="$MEM_FRACTION"
export ALFWORLD_DATA="$DATA"
export TOKENIZERS_PARALLELISM=false

CMD=("$PYTHON" -m roleagent_jax.main "--config=$CONFIG"
     "--config.mesh.data=$M_DATA" "--config.mesh.fsdp=$M_FSDP" "--config.mesh.tensor=$M_TENSOR")
[[ -n "$WORKDIR" ]] && CMD+=("--config.workdir=$WORKDIR")
[[ -n "$MODEL_PATH" ]] && CMD+=("--config.model.path=$MODEL_PATH")
CMD+=("${TRAINER_ARGS[@]+"${TRAINER_ARGS[@]}"}")

quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}
show() { printf '+'; for a in "$@"; do printf ' '; quote "$a"; done; printf '\n'; }

if (( DRY_RUN )); then
  for var in CUDA_VISIBLE_DEVICES XLA_FLAGS XLA_PYTHON_CLIENT_MEM_FRACTION ALFWORLD_DATA; do
    echo "export $var=$(quote "${!var}")"
  done
  (( INSTALL )) && show "$PYTHON" -m pip install -e . "$JAX_EXTRA"
  [[ -d "$DATA/json_2.1.1" ]] || show env "ALFWORLD_DATA=$DATA" alfworld-download
  show "${CMD[@]}"
  exit 0
fi

cd "$(dirname "$0")/.."
(( INSTALL )) && "$PYTHON" -m pip install -e . "$JAX_EXTRA"
if [[ ! -d "$DATA/json_2.1.1" ]]; then
  echo "[gpu] ALFWorld games not found in $DATA: downloading" >&2
  ALFWORLD_DATA="$DATA" alfworld-download
fi
mkdir -p "$(dirname "$LOG")"
attempt=0
while :; do
  echo "[gpu] $GPUS GPU(s), mesh data=$M_DATA fsdp=$M_FSDP tensor=$M_TENSOR, attempt $((attempt + 1))" >&2
  rc=0
  "${CMD[@]}" 2>&1 | tee -a "$LOG" || rc=$?
  (( rc == 0 )) && exit 0
  if (( rc == 2 )); then  # refused or a fault an operator must fix (docs/scaling.md): a rerun fails the same way
    echo "[gpu] trainer exited with 2: not restarting (see $LOG)" >&2
    exit 2
  fi
  attempt=$((attempt + 1))
  if (( attempt > MAX_RESTARTS )); then
    echo "[gpu] trainer exited with $rc (see $LOG)" >&2
    exit "$rc"
  fi
  echo "[gpu] exit $rc: restarting, the run resumes from its last checkpoint ($attempt/$MAX_RESTARTS)" >&2
  sleep 10
done

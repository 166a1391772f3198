#!/usr/bin/env bash
# Run roleagent_jax on a Cloud TPU VM or pod slice: create (or reuse) it, install, train on every worker,
# stream the logs, and recreate + resume when a spot/preemptible slice is taken away.
# See docs/scaling.md for the worked Qwen2.5-1.5B-Instruct ALFWorld example.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: launchers/tpu_vm.sh --name NAME --zone ZONE [options] [-- TRAINER ARGS...]

VM / slice
  --name NAME            TPU VM name (reused when it exists and is READY)
  --zone ZONE            e.g. us-central2-b
  --project PROJECT      gcloud project (default: gcloud's configured one)
  --accelerator TYPE     v4-8 (default), v4-32, v5litepod-16, v5p-8, v6e-8, ...
  --version RUNTIME      TPU software version (default: tpu-ubuntu2204-base for v4,
                         v2-alpha-tpuv5-lite for v5e, v2-alpha-tpuv5 for v5p, v2-alpha-tpuv6e for v6e)
  --spot                 create a spot slice (cheap, preemptible); the resume loop recreates it
  --hosts N              workers in the slice (default: derived from --accelerator)

code and data
  --repo URL             git clone URL on the workers (default: copy this checkout with scp)
  --branch BRANCH        branch or tag for --repo (default: main)
  --jax-extra SPEC       jax install spec (default: "jax[tpu]==0.10.2", matching pyproject.toml)
  --hf-model ID          download this Hugging Face model on every worker (e.g. Qwen/Qwen2.5-1.5B-Instruct)
                         and pass it as --config.model.path
  --model-path PATH      model directory already present on every worker (instead of --hf-model)
  --no-alfworld          skip `alfworld-download` (the games are needed by configs/alfworld.py)

run
  --config FILE          trainer config (default: configs/alfworld.py)
  --bucket gs://B/PATH   checkpoints and logs in GCS: mounted with gcsfuse on every worker at
                         /mnt/roleagent, and the run's workdir is /mnt/roleagent/<run-name>
  --workdir PATH         a shared, persistent workdir already mounted on every worker (NFS/Filestore)
  --run-name NAME        sub-directory of the bucket (default: the VM name)
  --max-restarts N       recreate-and-resume attempts after preemption (default: 20)
  --retry-on-error       also restart when the trainer fails on a healthy VM (default: stop)
  --delete-at-end        delete the VM after a successful run
  --log FILE             local copy of the streamed logs (default: logs/<name>.log)
  --setup-only           create and install, do not train
  --dry-run              print every command instead of running it (no gcloud needed)
  -h, --help             this help

Everything after `--` is passed to `python -m roleagent_jax.main`, e.g. -- --config.iterations=150
EOF
}

NAME="" ZONE="" PROJECT="" ACCEL="v4-8" VERSION="" SPOT=0 HOSTS=""
REPO="" BRANCH="main" JAX_EXTRA="jax[tpu]==0.10.2" HF_MODEL="" MODEL_PATH="" ALFWORLD=1
CONFIG="configs/alfworld.py" BUCKET="" WORKDIR="" RUN_NAME="" MAX_RESTARTS=20 RETRY_ON_ERROR=0
DELETE_AT_END=0 LOG="" SETUP_ONLY=0 DRY_RUN=0
TRAINER_ARGS=()

need() { [[ $# -ge 2 && -n "$2" ]] || { echo "error: $1 needs a value (see --help)" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) need "$@"; NAME="$2"; shift 2 ;;
    --zone) need "$@"; ZONE="$2"; shift 2 ;;
    --project) need "$@"; PROJECT="$2"; shift 2 ;;
    --accelerator) need "$@"; ACCEL="$2"; shift 2 ;;
    --version) need "$@"; VERSION="$2"; shift 2 ;;
    --spot) SPOT=1; shift ;;
    --hosts) need "$@"; HOSTS="$2"; shift 2 ;;
    --repo) need "$@"; REPO="$2"; shift 2 ;;
    --branch) need "$@"; BRANCH="$2"; shift 2 ;;
    --jax-extra) need "$@"; JAX_EXTRA="$2"; shift 2 ;;
    --hf-model) need "$@"; HF_MODEL="$2"; shift 2 ;;
    --model-path) need "$@"; MODEL_PATH="$2"; shift 2 ;;
    --no-alfworld) ALFWORLD=0; shift ;;
    --config) need "$@"; CONFIG="$2"; shift 2 ;;
    --bucket) need "$@"; BUCKET="$2"; shift 2 ;;
    --workdir) need "$@"; WORKDIR="$2"; shift 2 ;;
    --run-name) need "$@"; RUN_NAME="$2"; shift 2 ;;
    --max-restarts) need "$@"; MAX_RESTARTS="$2"; shift 2 ;;
    --retry-on-error) RETRY_ON_ERROR=1; shift ;;
    --delete-at-end) DELETE_AT_END=1; shift ;;
    --log) need "$@"; LOG="$2"; shift 2 ;;
    --setup-only) SETUP_ONLY=1; shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; TRAINER_ARGS=("$@"); break ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

[[ -n "$NAME" ]] || { echo "error: --name is required (see --help)" >&2; exit 2; }
[[ -n "$ZONE" ]] || { echo "error: --zone is required (see --help)" >&2; exit 2; }
[[ -n "$BUCKET" && -n "$WORKDIR" ]] && { echo "error: give --bucket or --workdir, not both" >&2; exit 2; }
[[ -n "$HF_MODEL" && -n "$MODEL_PATH" ]] && { echo "error: give --hf-model or --model-path, not both" >&2; exit 2; }
[[ -z "$BUCKET" || "$BUCKET" == gs://* ]] || { echo "error: --bucket must start with gs://" >&2; exit 2; }
[[ "$MAX_RESTARTS" =~ ^[0-9]+$ ]] || { echo "error: --max-restarts must be a number" >&2; exit 2; }
RUN_NAME="${RUN_NAME:-$NAME}"
LOG="${LOG:-logs/$NAME.log}"

default_version() {
  case "$1" in
    v5litepod-*|v5e-*) echo "v2-alpha-tpuv5-lite" ;;
    v5p-*) echo "v2-alpha-tpuv5" ;;
    v6e-*) echo "v2-alpha-tpuv6e" ;;
    *) echo "tpu-ubuntu2204-base" ;;
  esac
}

# Workers (hosts) in a slice: v2/v3/v4/v5p sizes count TensorCores (2 per chip, 4 chips per host);
# v5e/v6e sizes count chips (8-chip slices are one host, larger ones 4 chips per host).
hosts_for() {
  local type="$1" size="${1##*-}"
  [[ "$size" =~ ^[0-9]+$ ]] || { echo 1; return; }
  case "$type" in
    v5litepod-*|v5e-*|v6e-*) if (( size <= 8 )); then echo 1; else echo $(( size / 4 )); fi ;;
    *) if (( size <= 8 )); then echo 1; else echo $(( size / 8 )); fi ;;
  esac
}

VERSION="${VERSION:-$(default_version "$ACCEL")}"
HOSTS="${HOSTS:-$(hosts_for "$ACCEL")}"
GC=(gcloud compute tpus tpu-vm)
LOC=(--zone "$ZONE")
[[ -n "$PROJECT" ]] && LOC+=(--project "$PROJECT")
REMOTE_DIR='$HOME/roleagent_jax'
MOUNT=/mnt/roleagent

say() { echo "[tpu_vm] $*" >&2; }

# Single-quote an argument only when it needs it (readable dry-run output that can still be pasted).
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then printf '%s' "$1"; else printf "'%s'" "${1//\'/\'\\\'\'}"; fi
}

# Print (dry run) or run a command. Printing goes to fd 3 (the script's stdout) so commands issued
# inside $(...) captures still show, in order.
exec 3>&1
run() {
  if (( DRY_RUN )); then
    { printf '+'; for a in "$@"; do printf ' '; quote "$a"; done; printf '\n'; } >&3
  else
    "$@"
  fi
}

on_workers() { run "${GC[@]}" ssh "$NAME" "${LOC[@]}" --worker=all --command "$1"; }

vm_state() {
  if (( DRY_RUN )); then
    run "${GC[@]}" describe "$NAME" "${LOC[@]}" --format='value(state)'
    echo "ABSENT"
    return
  fi
  "${GC[@]}" describe "$NAME" "${LOC[@]}" --format='value(state)' 2>/dev/null || echo "ABSENT"
}

create_vm() {
  local args=("${GC[@]}" create "$NAME" "${LOC[@]}" --accelerator-type "$ACCEL" --version "$VERSION")
  (( SPOT )) && args+=(--spot)
  run "${args[@]}"
}

ensure_vm() {
  local state
  state="$(vm_state)"
  case "$state" in
    READY) say "reusing $NAME (READY)" ;;
    ABSENT|"") say "creating $NAME ($ACCEL, $VERSION)"; create_vm ;;
    CREATING|STARTING|RESTARTING|REPAIRING)
      say "$NAME is $state; waiting"
      while [[ "$(vm_state)" != READY ]]; do sleep 30; done ;;
    *) say "$NAME is $state (preempted or stopped): deleting and recreating"
       run "${GC[@]}" delete "$NAME" "${LOC[@]}" --quiet
       create_vm ;;
  esac
}

copy_code() {
  if [[ -n "$REPO" ]]; then
    on_workers "set -e; if [ -d $REMOTE_DIR/.git ]; then cd $REMOTE_DIR && git fetch --depth 1 origin $BRANCH && git checkout -f FETCH_HEAD; else git clone --depth 1 --branch $BRANCH $REPO $REMOTE_DIR; fi"
  else
    local bundle="/tmp/roleagent_jax-$NAME.tgz"
    run bash -c "cd \"$(git rev-parse --show-toplevel 2>/dev/null || pwd)\" && git ls-files -z --cached --others --exclude-standard | tar --null -czf $bundle -T -"
    run "${GC[@]}" scp "$bundle" "$NAME:/tmp/roleagent_jax.tgz" "${LOC[@]}" --worker=all
    on_workers "set -e; mkdir -p $REMOTE_DIR && tar -xzf /tmp/roleagent_jax.tgz -C $REMOTE_DIR"
  fi
}

install() {
  local steps="set -e; cd $REMOTE_DIR; python3 -m venv \$HOME/venv; \$HOME/venv/bin/pip install -q -U pip"
  steps+="; \$HOME/venv/bin/pip install -q -e . '$JAX_EXTRA'"
  (( ALFWORLD )) && steps+="; [ -d \$HOME/alfworld/json_2.1.1 ] || ALFWORLD_DATA=\$HOME/alfworld \$HOME/venv/bin/alfworld-download"
  # huggingface_hub >= 1.0 (installed with transformers) names its CLI `hf`; older ones `huggingface-cli`.
  [[ -n "$HF_MODEL" ]] && steps+="; [ -f \$HOME/models/${HF_MODEL##*/}/config.json ] || { PATH=\$HOME/venv/bin:\$PATH; if command -v hf >/dev/null; then hf download $HF_MODEL --local-dir \$HOME/models/${HF_MODEL##*/}; else huggingface-cli download $HF_MODEL --local-dir \$HOME/models/${HF_MODEL##*/}; fi; }"
  if [[ -n "$BUCKET" ]]; then
    local bucket="${BUCKET#gs://}"
    steps+="; if ! command -v gcsfuse >/dev/null; then"
    steps+=" echo \"deb [signed-by=/usr/share/keyrings/cloud.google.asc] https://packages.cloud.google.com/apt gcsfuse-\$(lsb_release -c -s) main\" | sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null"
    steps+=" && curl -s https://packages.cloud.google.com/apt/doc/apt-key.gpg | sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null"
    steps+=" && sudo apt-get update -q && sudo apt-get install -y -q gcsfuse; fi"
    steps+="; sudo mkdir -p $MOUNT && sudo chown \$USER $MOUNT"
    local only=""
    [[ "$bucket" == */* ]] && only="--only-dir ${bucket#*/} "
    steps+="; mountpoint -q $MOUNT || gcsfuse --implicit-dirs $only${bucket%%/*} $MOUNT"
  fi
  on_workers "$steps"
}

train_command() {
  local workdir="$WORKDIR"
  [[ -n "$BUCKET" ]] && workdir="$MOUNT/$RUN_NAME"
  local cmd="set -o pipefail; cd $REMOTE_DIR && export ALFWORLD_DATA=\$HOME/alfworld"
  (( HOSTS > 1 )) && cmd+=" ROLEAGENT_DISTRIBUTED=auto"
  cmd+=" && \$HOME/venv/bin/python -m roleagent_jax.main $(printf '%q' "--config=$CONFIG")"
  [[ -n "$workdir" ]] && cmd+=" $(printf '%q' "--config.workdir=$workdir")"
  [[ -n "$HF_MODEL" ]] && cmd+=" --config.model.path=\$HOME/models/${HF_MODEL##*/}"
  [[ -n "$MODEL_PATH" ]] && cmd+=" $(printf '%q' "--config.model.path=$MODEL_PATH")"
  local arg
  for arg in "${TRAINER_ARGS[@]+"${TRAINER_ARGS[@]}"}"; do cmd+=" $(printf '%q' "$arg")"; done
  cmd+=" 2>&1 | tee -a \$HOME/train.log"
  echo "$cmd"
}

if [[ -z "$BUCKET" && -z "$WORKDIR" ]]; then
  say "warning: no --bucket/--workdir: checkpoints stay on the VM's disk and are lost if the slice is preempted"
  (( HOSTS > 1 )) && say "warning: a multi-host slice needs a shared workdir for orbax checkpoints (--bucket)"
fi
(( DRY_RUN )) || mkdir -p "$(dirname "$LOG")"

attempt=0
while :; do
  ensure_vm
  copy_code
  install
  if (( SETUP_ONLY )); then say "setup done"; exit 0; fi
  say "training on $HOSTS worker(s), attempt $((attempt + 1)); logs also in $LOG"
  rc=0
  if (( DRY_RUN )); then
    on_workers "$(train_command)"
  else
    on_workers "$(train_command)" 2>&1 | tee -a "$LOG" || rc=$?
  fi
  if (( rc == 0 )); then
    say "run finished"
    (( DELETE_AT_END )) && run "${GC[@]}" delete "$NAME" "${LOC[@]}" --quiet
    exit 0
  fi
  state="$(vm_state)"
  if [[ "$state" == READY ]] && (( ! RETRY_ON_ERROR )); then
    say "trainer failed (exit $rc) on a healthy VM: not restarting (see $LOG; --retry-on-error to force)"
    exit "$rc"
  fi
  attempt=$((attempt + 1))
  if (( attempt > MAX_RESTARTS )); then
    say "giving up after $MAX_RESTARTS restarts"
    exit 1
  fi
  say "VM state $state after exit $rc: recreating and resuming from the last checkpoint ($attempt/$MAX_RESTARTS)"
  sleep 30
done

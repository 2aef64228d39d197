#!/usr/bin/env bash
# torchrun for torchrl_post, on one node or many (c10d rendezvous). Hydra overrides pass through.
#
#   launch/run.sh [launcher options] [--config-name NAME] [key=value ...]
#
#   launch/run.sh trainer.total_training_steps=50                     # one node, GPUs (else 2 processes)
#   launch/run.sh --nproc-per-node 8 --config-name math_agent         # one node, 8 processes
#   # two nodes: the same command on each, the first node's address as the endpoint
#   launch/run.sh --nnodes 2 --node-rank 0 --rdzv-endpoint node1:29400 placement.actor=[0..7] ...   # on node1
#   launch/run.sh --nnodes 2 --node-rank 1 --rdzv-endpoint node1:29400 placement.actor=[0..7] ...   # on node2
#
# Launcher options; each has an environment variable (in brackets) that sets it too, the option wins:
#   --nproc-per-node N   processes on this node [NPROC_PER_NODE]; default: the GPUs visible, else 2
#   --nnodes N           number of nodes [NNODES]; default 1: a standalone rendezvous on a free local port
#   --node-rank R        this node's rank, for the log line [NODE_RANK]; default SLURM_NODEID, else 0. The c10d
#                        rendezvous numbers the nodes itself, in the order of their --local-addr (then process
#                        ids): give each node its address and the first node the lowest to fix the order
#   --rdzv-endpoint H:P  the c10d rendezvous, on the first node [RDZV_ENDPOINT]; needed with --nnodes > 1
#   --rdzv-id ID         one id per job, the same on every node [RDZV_ID]; default SLURM_JOB_ID, else torchrl_post
#   --local-addr ADDR    this node's address as the other nodes reach it [LOCAL_ADDR]; default: its FQDN
#   --max-restarts N     restart every node's workers after a failure, resuming from the latest checkpoint
#                        [MAX_RESTARTS]; default 0
#   --shutdown-timeout S seconds the workers get to checkpoint after SIGTERM before SIGKILL [SHUTDOWN_TIMEOUT];
#                        default 110 (torchrun's own default is 30)
#   --log-dir DIR        also write each rank's output under DIR, lines prefixed [rankN]: [LOG_DIR]
#   --print              print the torchrun command line and exit
#   --                   ends the launcher options; everything after it goes to the trainer
# Everything else goes to `python -m torchrl_post.train` unchanged (--config-name NAME, key=value ...).
#
# Python: TORCHRL_POST_PYTHON, else the repository's .venv/bin/python when there is one, else python3.
# SIGTERM to this script (or to torchrun) reaches every worker: the trainer finishes its step, saves a
# checkpoint and exits; running the same command again resumes from it (trainer.resume_mode=auto).
set -euo pipefail

die() {
  echo "launch/run.sh: $*" >&2
  exit 2
}

repo=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)

nproc=${NPROC_PER_NODE:-}
nnodes=${NNODES:-1}
node_rank=${NODE_RANK:-${SLURM_NODEID:-0}}
endpoint=${RDZV_ENDPOINT:-}
rdzv_id=${RDZV_ID:-${SLURM_JOB_ID:-torchrl_post}}
local_addr=${LOCAL_ADDR:-}
max_restarts=${MAX_RESTARTS:-0}
shutdown_timeout=${SHUTDOWN_TIMEOUT:-110}
log_dir=${LOG_DIR:-}
print_only=0
train_args=()

while (($#)); do
  case $1 in
    --nproc-per-node | --nproc_per_node) nproc=${2:?$1 needs a value}; shift 2 ;;
    --nnodes) nnodes=${2:?$1 needs a value}; shift 2 ;;
    --node-rank | --node_rank) node_rank=${2:?$1 needs a value}; shift 2 ;;
    --rdzv-endpoint | --rdzv_endpoint) endpoint=${2:?$1 needs a value}; shift 2 ;;
    --rdzv-id | --rdzv_id) rdzv_id=${2:?$1 needs a value}; shift 2 ;;
    --local-addr | --local_addr) local_addr=${2:?$1 needs a value}; shift 2 ;;
    --max-restarts | --max_restarts) max_restarts=${2:?$1 needs a value}; shift 2 ;;
    --shutdown-timeout | --shutdown_timeout) shutdown_timeout=${2:?$1 needs a value}; shift 2 ;;
    --log-dir | --log_dir) log_dir=${2:?$1 needs a value}; shift 2 ;;
    --nproc-per-node=* | --nproc_per_node=*) nproc=${1#*=}; shift ;;
    --nnodes=*) nnodes=${1#*=}; shift ;;
    --node-rank=* | --node_rank=*) node_rank=${1#*=}; shift ;;
    --rdzv-endpoint=* | --rdzv_endpoint=*) endpoint=${1#*=}; shift ;;
    --rdzv-id=* | --rdzv_id=*) rdzv_id=${1#*=}; shift ;;
    --local-addr=* | --local_addr=*) local_addr=${1#*=}; shift ;;
    --max-restarts=* | --max_restarts=*) max_restarts=${1#*=}; shift ;;
    --shutdown-timeout=* | --shutdown_timeout=*) shutdown_timeout=${1#*=}; shift ;;
    --log-dir=* | --log_dir=*) log_dir=${1#*=}; shift ;;
    --print) print_only=1; shift ;;
    --) shift; train_args+=("$@"); break ;;
    *) train_args+=("$1"); shift ;;
  esac
done

python=${TORCHRL_POST_PYTHON:-}
if [[ -z $python ]]; then
  if [[ -x $repo/.venv/bin/python ]]; then
    python=$repo/.venv/bin/python
  else
    python=$(command -v python3 || true)
    [[ -n $python ]] || die "no python: set TORCHRL_POST_PYTHON or run 'make setup'"
  fi
fi

if [[ -z $nproc ]]; then
  gpus=0
  if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  fi
  if [[ -v CUDA_VISIBLE_DEVICES ]] && ((gpus > 0)); then # only those (an empty list hides them all)
    IFS=, read -ra visible <<<"$CUDA_VISIBLE_DEVICES"
    ((${#visible[@]} >= gpus)) || gpus=${#visible[@]}
  fi
  nproc=$((gpus > 0 ? gpus : 2))
fi

for pair in "nproc-per-node:$nproc" "nnodes:$nnodes" "node-rank:$node_rank" "max-restarts:$max_restarts" \
  "shutdown-timeout:$shutdown_timeout"; do
  [[ ${pair#*:} =~ ^[0-9]+$ ]] || die "--${pair%%:*} must be a whole number, got '${pair#*:}'"
done
((nproc >= 1)) || die "--nproc-per-node must be at least 1"
((nnodes >= 1)) || die "--nnodes must be at least 1"
((node_rank < nnodes)) || die "--node-rank $node_rank must be below --nnodes $nnodes"

cmd=("$python" -m torch.distributed.run --nproc-per-node "$nproc" --max-restarts "$max_restarts"
  --shutdown-timeout "$shutdown_timeout")
if ((nnodes == 1)) && [[ -z $endpoint ]]; then
  cmd+=(--standalone)
else
  [[ $endpoint == ?*:[0-9]* ]] || die "--nnodes $nnodes needs --rdzv-endpoint HOST:PORT (the first node), got '$endpoint'"
  cmd+=(--nnodes "$nnodes" --rdzv-backend c10d --rdzv-endpoint "$endpoint"
    --rdzv-id "$rdzv_id")
  [[ -z $local_addr ]] || cmd+=(--local-addr "$local_addr")
  # The agent's INFO lines name this node's group rank and its global ranks ("Rendezvous complete").
  export LOGLEVEL=${LOGLEVEL:-INFO}
fi
if [[ -n $log_dir ]]; then
  mkdir -p -- "$log_dir"
  cmd+=(--log-dir "$log_dir" --tee 3)
  export PYTHONUNBUFFERED=1
  # shellcheck disable=SC2016  # ${rank} is torchrun's template, not the shell's
  export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=${TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE:-'[rank${rank}]:'}
fi
cmd+=(-m torchrl_post.train ${train_args[@]+"${train_args[@]}"}) # (bash < 4.4 and an empty array)

export TOKENIZERS_PARALLELISM=${TOKENIZERS_PARALLELISM:-false}
echo "launch/run.sh: node $node_rank of $nnodes on $(hostname), $nproc processes:$(printf ' %q' "${cmd[@]}")" >&2
((print_only)) && exit 0
exec "${cmd[@]}"

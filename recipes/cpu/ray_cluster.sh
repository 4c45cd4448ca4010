#!/usr/bin/env bash
# A Ray cluster of several nodes on this one machine, to run a recipe as on a multi-node cluster (docs/cpu.md):
#   recipes/cpu/ray_cluster.sh start [NNODES]   # a head and NNODES-1 more nodes [2]; prints the RAY_ADDRESS line
#   recipes/cpu/ray_cluster.sh stop             # this cluster's processes, and the runs they hold
# Each node is its own `ray start` (raylet, object store) with N_GPUS_PER_NODE [1] logical GPUs and the
# logical CPUs that follow from it (verl_memagent/cpu/topology.py); the head's dashboard takes
# `ray job submit`, as on a real cluster. Loopback only: the nodes advertise 127.0.0.1 and the
# dashboard listens there, so Ray's token authentication is turned off (RAY_AUTH_MODE=disabled).
# Ports: RAY_PORT [6379] (the head's GCS), RAY_DASHBOARD_PORT [8265]. RAY_CLUSTER_DIR
# [/tmp/memagent_ray_cluster] holds its sessions and logs; a local Ray that a run starts without
# RAY_ADDRESS never joins this cluster, and `stop` leaves any other Ray of the machine alone.
set -euo pipefail

N_GPUS_PER_NODE=${N_GPUS_PER_NODE:-1}
RAY_PORT=${RAY_PORT:-6379}
RAY_DASHBOARD_PORT=${RAY_DASHBOARD_PORT:-8265}
RAY_CLUSTER_DIR=${RAY_CLUSTER_DIR:-/tmp/memagent_ray_cluster}
export RAY_AUTH_MODE=disabled

# The pids of `$1` and of all its descendants (Ray's workers are its raylet's children, a job's driver
# its supervisor's).
with_descendants() {
  local child
  echo "$1"
  for child in $(pgrep -P "$1"); do with_descendants "$child"; done
}

case "${1:-}" in
  start)
    nnodes=${2:-2}
    mapfile -t resources < <(python -m verl_memagent.cpu.topology ray-start --n-gpus-per-node "$N_GPUS_PER_NODE")
    # a small object store per node: verl moves batches through TransferQueue, not Ray's object store.
    # Each node's dashboard agent on a port of its own (0: one the system picks): at Ray's fixed default
    # (52365) it finds the port of any other Ray of this machine taken, and the dashboard then has no
    # agent to hand `ray job submit` to ("No available agent to submit job").
    common=(--node-ip-address=127.0.0.1 --temp-dir="$RAY_CLUSTER_DIR" --object-store-memory=$((512 * 1024 * 1024))
      --dashboard-agent-listen-port=0 --disable-usage-stats "${resources[@]}")
    ray start --head --port="$RAY_PORT" --dashboard-host=127.0.0.1 --dashboard-port="$RAY_DASHBOARD_PORT" \
      --include-dashboard=true "${common[@]}" >/dev/null
    for _ in $(seq 2 "$nnodes"); do
      ray start --address="127.0.0.1:$RAY_PORT" "${common[@]}" >/dev/null
    done
    echo "RAY_ADDRESS=http://127.0.0.1:$RAY_DASHBOARD_PORT"
    ;;
  stop)
    # every daemon of this cluster (GCS, raylets, dashboard, agents) names one of its session folders
    pids=$(for pid in $(pgrep -f -- "$RAY_CLUSTER_DIR/session_"); do with_descendants "$pid"; done | sort -u)
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    ;;
  *)
    echo "usage: recipes/cpu/ray_cluster.sh start [NNODES] | stop" >&2
    exit 2
    ;;
esac

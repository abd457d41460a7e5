#!/usr/bin/env bash
# The GPU check of --executor batched (docs/performance.md, "Many clients on one GPU"), as one prepared
# command of at most 6 minutes on a CUDA machine; scripts/experiments/gpu_batched.py says what it measures.
# It needs, in the tree: .gpu/mnist.npz (MNIST as ../shared/data holds it) and .gpu/pfllib/system (PFLlib's
# system/ folder, for its FedAvg on the same split); both are git-ignored and travel with the run.
#
#   bash scripts/experiments/gpu_batched.sh          # writes $OUT/gpu_batched.json (default results/gpu_batched)
#   DEV=cpu bash scripts/experiments/gpu_batched.sh  # the dry run: the same steps on the CPU, small
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-results/gpu_batched}
DEV=${DEV:-cuda}
mkdir -p "$OUT"
SMALL=()
if [ "$DEV" = cpu ]; then SMALL=(--small --clients 20,100,500:100); export OMP_NUM_THREADS=1; fi  # shared CPUs: one thread
if [ "$DEV" = cuda ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
fi
timeout -s INT "${LIMIT:-350}" python3 scripts/experiments/gpu_batched.py --dev "$DEV" "${SMALL[@]}" --out "$OUT" \
        --budget "${BUDGET:-300}" 2>&1 | tee "$OUT/gpu_batched.log" | grep --line-buffered -v "^round "

#!/usr/bin/env bash
# The GPU check of docs/performance.md and docs/benchmark.md, as one prepared command for a CUDA machine:
#   1. seconds per round of FedAvg and FedALA on full MNIST Dir(0.1) (20 clients, the 4-layer CNN, batch 10,
#      evaluation every round), on the GPU, sequential executor, one run at a time (scripts/run/benchmark.py:
#      the phases of each round);
#   2. Protocol B cells at full scale (all 70,000 Fashion-MNIST images, Dir(0.1) and pathological, 20
#      clients, -lr 0.005, seed 0), all started together (one process each, the GPU shared) and each stopped
#      after CELL_SECONDS (SIGTERM: an interrupted run keeps its evaluations), -gr 2000 as PFLlib's
#      leaderboard, so each cell reaches the rounds its cost allows; scripts/experiments/gpu_cells.py compares them at
#      equal rounds (--rounds), never at each cell's own last round.
# Everything it writes goes under results/gpu_check/.
#
#   bash scripts/experiments/gpu_check.sh DATA_DIR          # DATA_DIR holds mnist.npz and fmnist.npz (README: Generating client splits)
#   TIMING_ROUNDS=3 CELL_SECONDS=300 DIR_ALGOS="FedAvg FedCP" PAT_ALGOS="FedCP" bash scripts/experiments/gpu_check.sh
#   DEV=cpu ...                                  # the same steps on the CPU (a dry run of the script itself)
set -uo pipefail
cd "$(dirname "$0")/../.."
DATA=${1:?"usage: bash scripts/experiments/gpu_check.sh DATA_DIR, a folder holding mnist.npz and fmnist.npz (the README's Generating client splits says how to make them)"}
OUT=results/gpu_check
DEV=${DEV:-cuda}
TIMING_ROUNDS=${TIMING_ROUNDS:-3}
CELL_SECONDS=${CELL_SECONDS:-330}
DIR_ALGOS=${DIR_ALGOS:-"FedCP FedALA FedAvg Local FD APPLE GPFL FedDBE FedRep Ditto"}
PAT_ALGOS=${PAT_ALGOS:-"FedCP FedALA FedAvg Local"}
mkdir -p "$OUT"
if [ "$DEV" = cuda ]; then
  python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: this check needs a GPU')" || exit 2
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
fi
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])" | tee -a "$OUT/gpu.txt"
MAIN=(python3 system/main.py -dev "$DEV" --executor sequential --results_dir "$OUT" --overwrite --no-progress
      --no-print_config --train_loss_eval off -m CNN -lbs 10 -lr 0.005)

python3 dataset/generate_MNIST.py --partition dir --alpha 0.1 --num-clients 20 --seed 1 --out MNIST_dir0.1 \
        --source "$DATA/mnist.npz" | tail -n 1
python3 dataset/generate_FashionMNIST.py --partition pat --layout pfllib --num-clients 20 --seed 1 \
        --out FMNIST_pat --source "$DATA/fmnist.npz" | tail -n 1
python3 dataset/generate_FashionMNIST.py --partition dir --alpha 0.1 --num-clients 20 --seed 1 \
        --out FMNIST_dir0.1 --source "$DATA/fmnist.npz" | tail -n 1

# 1. round time, one run at a time (a hang or a failure is cut short and the cells still run)
for algo in FedAvg FedALA; do
  timeout 150 python3 scripts/run/benchmark.py -dev "$DEV" -data MNIST_dir0.1 -m CNN -algo "$algo" -lbs 10 -lr 0.005 \
          -gr "$TIMING_ROUNDS" --steady_from 2 --executors sequential --ref_seconds 1 \
          --json "$OUT/timing_$algo.json" > "$OUT/timing_$algo.log" 2>&1
  echo "timing $algo: exit $?"; tail -n 4 "$OUT/timing_$algo.log"
done

# 2. the cells, together, each for CELL_SECONDS
pids=()
cells() {  # cells SPLIT TAG ALGO...: one background run per algorithm, each under the wall-time limit
  local split=$1 tag=$2 algo; shift 2
  for algo in "$@"; do
    OMP_NUM_THREADS=1 timeout -s TERM "$CELL_SECONDS" "${MAIN[@]}" -data "$split" -algo "$algo" -gr 2000 \
        -go gpu-cell > "$OUT/cell_${tag}_$algo.log" 2>&1 & pids+=($!)
  done
}
cells FMNIST_dir0.1 dir $DIR_ALGOS
cells FMNIST_pat pat $PAT_ALGOS
wait "${pids[@]}"
for f in "$OUT"/cell_*.log; do echo "== $f"; tail -n 2 "$f"; done
python3 scripts/experiments/gpu_cells.py "$OUT" | tee "$OUT/cells.md"

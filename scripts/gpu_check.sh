#!/usr/bin/env bash
# The GPU check of docs/performance.md, as one prepared command for a CUDA machine:
#   1. seconds per round of FedAvg and FedALA on full MNIST Dir(0.1) (20 clients, the 4-layer CNN, batch 10,
#      evaluation every round), on the GPU, sequential executor;
#   2. a few Protocol B cells at full scale (all 70,000 Fashion-MNIST images, pathological and Dir(0.1),
#      -lr 0.005), for as many rounds as the time allows (PFLlib's leaderboard runs 2000).
# Everything it writes goes under results/gpu_check/ (the table at the end is what docs/performance.md quotes).
#
#   bash scripts/gpu_check.sh [DATA_DIR]        # DATA_DIR holds mnist.npz and fmnist.npz (default ../shared/data)
#   TIMING_ROUNDS=10 CELL_ROUNDS=30 CELL_ALGOS="FedAvg FedALA FedCP" bash scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-../shared/data}
OUT=results/gpu_check
TIMING_ROUNDS=${TIMING_ROUNDS:-10}
CELL_ROUNDS=${CELL_ROUNDS:-30}
CELL_ALGOS=${CELL_ALGOS:-"FedAvg FedALA FedCP GPFL FedDBE"}
mkdir -p "$OUT"
python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: this check needs a GPU')"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
run() { python3 system/main.py -dev cuda --executor sequential --results_dir "$OUT" --overwrite --no-progress \
          --no-print_config --train_loss_eval off -m CNN -lbs 10 -eg 1 -lr 0.005 "$@"; }

python3 dataset/generate_MNIST.py --partition dir --alpha 0.1 --num-clients 20 --seed 1 --out MNIST_dir0.1 \
        --source "$DATA/mnist.npz" | tail -n 1
for algo in FedAvg FedALA; do
  run -data MNIST_dir0.1 -algo "$algo" -gr "$TIMING_ROUNDS" -go gpu-timing
done

python3 dataset/generate_FashionMNIST.py --partition pat --layout pfllib --num-clients 20 --seed 1 \
        --out FMNIST_pat --source "$DATA/fmnist.npz" | tail -n 1
python3 dataset/generate_FashionMNIST.py --partition dir --alpha 0.1 --num-clients 20 --seed 1 \
        --out FMNIST_dir0.1 --source "$DATA/fmnist.npz" | tail -n 1
for split in FMNIST_pat FMNIST_dir0.1; do
  for algo in $CELL_ALGOS; do
    run -data "$split" -algo "$algo" -gr "$CELL_ROUNDS" -go gpu-cell
  done
done
python3 scripts/table.py "$OUT" --group dataset,algorithm,global_rounds --columns best,last,time,seeds | tee "$OUT/table.md"

#!/bin/sh
# Runs the catalogue's paper studies on this machine and writes each report under docs/results/STUDY/.
#   sh docs/results/run.sh [STUDY ...]      (default: all of them; from the repository root)
# The MLflow store is docs/results/.store (not committed): `ablate ui --tracking-uri sqlite:///$PWD/docs/results/.store/mlflow.db`;
# the tuned study's Optuna searches are in docs/results/.store/optuna.db (`ablate ui --optuna --storage ...`).
set -eu
STORE="sqlite:///$(pwd)/docs/results/.store/mlflow.db"
export ABLATE_OPTUNA_STORAGE="sqlite:///$(pwd)/docs/results/.store/optuna.db"
mkdir -p docs/results/.store
for study in ${@:-heads heads_text positions norm_placement norm_placement_tuned attention_score locality locality_text}; do
  start=$(date +%s)
  .venv/bin/ablate sweep "ablations/studies/$study.yaml" --tracking-uri "$STORE"
  .venv/bin/ablate report "$study" --tracking-uri "$STORE" --out "docs/results/$study"
  rm -f "docs/results/$study/report.html"   # 4.7 MB of plotly each: the tables and PNGs are committed
  echo "$study: $(( $(date +%s) - start )) s" | tee -a docs/results/.store/timings.txt
done
if [ $# -eq 0 ]; then  # the companion tables, and Michel et al.'s head removal
  .venv/bin/ablate report positions --metric test/exact_match --baseline "positions=sinusoidal max_steps=1200" \
    --tracking-uri "$STORE" --out docs/results/positions_in_distribution --no-log
  .venv/bin/ablate report heads --metric final/val_loss --tracking-uri "$STORE" --out docs/results/heads_val_loss --no-log
  rm -f docs/results/*/report.html
  start=$(date +%s)
  .venv/bin/ablate sweep ablations/studies/michel_heads.yaml --tracking-uri "$STORE"
  .venv/bin/ablate heads michel_heads --tracking-uri "$STORE" --metric val/loss --out docs/results/michel_heads
  echo "michel_heads: $(( $(date +%s) - start )) s" | tee -a docs/results/.store/timings.txt
fi
.venv/bin/python docs/results/papers.py   # the papers' numbers beside ours: STUDY/paper_vs_ours.png

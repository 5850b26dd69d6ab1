#!/bin/sh
# Runs the catalogue's paper studies on this machine and writes each report under docs/results/STUDY/.
#   sh docs/results/run.sh [STUDY ...]      (default: all of them, in the order below; from the repository root)
# Each study's seeds and contrasts are declared in its file before it runs (ablations/studies/STUDY.yaml).
# The MLflow store is docs/results/.store (not committed): `ablate ui --tracking-uri sqlite:///$PWD/docs/results/.store/mlflow.db`;
# the tuned studies' Optuna searches are in docs/results/.store/optuna.db (`ablate ui --optuna --storage ...`).
# Wall time per study is appended to docs/results/.store/timings.txt.
# Stopped part-way, the same command continues it, here or on another machine with docs/results/.store copied there.
set -eu
STORE="sqlite:///$(pwd)/docs/results/.store/mlflow.db"
export ABLATE_OPTUNA_STORAGE="sqlite:///$(pwd)/docs/results/.store/optuna.db"
ALL="heads heads_tuned positions positions_tuned norm_placement norm_placement_long michel_heads michel_heads_long decoding decoding_long scheduled_sampling scheduled_sampling_long nat nat_long attention_score attention_score_long attention_score_tuned norm_placement_tuned norm_placement_tuned_long similarity_text similarity_recall locality locality_tuned heads_planned"
mkdir -p docs/results/.store
for study in ${@:-$ALL}; do
  start=$(date +%s)
  .venv/bin/ablate sweep "ablations/studies/$study.yaml" --tracking-uri "$STORE"
  .venv/bin/ablate report "$study" --tracking-uri "$STORE" --out "docs/results/$study"
  case "$study" in
    positions|positions_tuned)  # length generalisation: the predictions from positions training never saw
      .venv/bin/ablate report "$study" --metric test_long/loss --tracking-uri "$STORE" --out "docs/results/${study}_long" --no-log ;;
    michel_heads|michel_heads_long)  # each head removed alone, one head per module, and pruning curves (Michel et al. 2019)
      .venv/bin/ablate heads "$study" --metric val/loss --prune test/loss --tracking-uri "$STORE" --out "docs/results/$study" ;;
  esac
  rm -f docs/results/*/report.html docs/results/*/plots.html   # about 5 MB of plotly each: MLflow keeps them
  echo "$study: $(( $(date +%s) - start )) s" | tee -a docs/results/.store/timings.txt
done
.venv/bin/python docs/results/papers.py   # the papers' numbers beside ours: STUDY/paper_vs_ours.png
.venv/bin/python docs/results/verdicts.py  # README.md's verdict table, from each folder's seeds.csv and contrasts.csv

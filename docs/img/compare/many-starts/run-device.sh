#!/usr/bin/env bash
# The seventh pre-registered run for issue 5 (see PREREGISTERED.txt): 16 seeds of the quickstart's
# setting, one process a seed, on a 16-core machine's CPUs. Run from the repository root with turnrl
# importable; OUT (optional) receives the results (JSON files and logs, no model weights).
# usage: bash docs/img/compare/many-starts/run-device.sh [SECONDS]   (the per-seed time limit, default 530)
set -u
limit=${1:-530}
out_dir=runs/cf16
export TURNRL_PROGRESS=0 OMP_NUM_THREADS=1 PYTHONWARNINGS=ignore PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=
mkdir -p "$out_dir/logs"
for s in $(seq 2000 2015); do
  timeout "$limit" python3 -m turnrl compare --config configs/compare/tictactoe_random.yaml out=$out_dir \
      pipeline.train.lr=1e-5 pipeline.train.epochs=4 "seeds=[$s]" > "$out_dir/logs/seed-$s.log" 2>&1 &
done
wait
for s in $(seq 2000 2015); do
  if [ -f "$out_dir/seed-$s/dmpo.json.done.json" ]; then echo "seed $s: done"; else echo "seed $s: NOT finished"; fi
done
if [ -n "${OUT:-}" ]; then
  (cd runs && find cf16 -name '*.json' ! -path '*/checkpoints/*' ! -path '*/model/*' -print0 | tar czf "$OUT/json.tgz" --null -T -)
  (cd runs && tar czf "$OUT/logs.tgz" cf16/logs)
  (cd runs && find cf16 -name 'pairs.jsonl' -print0 | tar czf "$OUT/pairs.tgz" --null -T -)
  (cd runs && find cf16 -name '*eval-seen.jsonl' -print0 | tar czf "$OUT/evals.tgz" --null -T -)
  ls -la "$OUT"
fi

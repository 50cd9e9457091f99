#!/usr/bin/env bash
# Measure: the pairwise preference model, trained on env-reward comparisons of tic-tac-toe
# trajectories of mixed quality, agrees with the env-reward oracle on held-out pairs.
# Usage: bash configs/sppo/pairwise_agreement.sh [OUT]   (OUT defaults to runs/pairwise)
set -euo pipefail
OUT=${1:-runs/pairwise}
N=${N:-150}        # train tasks
M=${M:-60}         # held-out tasks (the seen split: other opponent seeds)
mkdir -p "$OUT"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# mixed quality, one style of text: the random policy 4 times a task (4 seeds) + the minimax expert
for split in train seen; do
  n=$N; [ "$split" = seen ] && n=$M
  for seed in 0 1 2 3; do
    turnrl collect --env tictactoe --env-opt opponent=random --policy random --split $split \
      --episodes $n --seed $seed --out "$OUT/$split-random-$seed.jsonl" > /dev/null
  done
  turnrl collect --env tictactoe --env-opt opponent=random --policy expert --split $split \
    --episodes $n --seed 0 --out "$OUT/$split-expert.jsonl" > /dev/null
done
turnrl comparisons --skip-ties --seed 0 --out "$OUT/train.jsonl" \
  $(for f in "$OUT"/train-*.jsonl; do echo --trajectories "$f"; done)
turnrl comparisons --skip-ties --seed 1 --out "$OUT/held.jsonl" \
  $(for f in "$OUT"/seen-*.jsonl; do echo --trajectories "$f"; done)
turnrl train preference-model --config configs/sppo/preference_model.yaml \
  --data "$OUT/train.jsonl" --eval-data "$OUT/held.jsonl" --out "$OUT/model" --resume
python - "$OUT" <<'PY'
import json, sys
from turnrl.oracles import read_comparisons
from turnrl.oracles.pairwise import PairwiseModelOracle
out = sys.argv[1]
held = read_comparisons(f"{out}/held.jsonl")
p = PairwiseModelOracle(f"{out}/model/model").probs([(c.task_id, c.a, c.b) for c in held])
agree = [(pi > 0.5) == (c.label > 0.5) for pi, c in zip(p, held)]
rr = [a for a, c in zip(agree, held) if c.a.source != "expert" and c.b.source != "expert"]
e = json.load(open(f"{out}/model/eval.json"))
print(json.dumps({"held_out_pairs": len(held), "agreement": sum(agree) / len(agree),
                  "agreement_random_vs_random": sum(rr) / max(1, len(rr)), "random_vs_random_pairs": len(rr),
                  "agreement_before_training": e["start"]["accuracy"]}))
PY

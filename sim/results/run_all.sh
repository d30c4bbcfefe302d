#!/bin/sh
# Regenerates sim/results/ (run from sim/results/, build tree ../../build-sim).
# Every run: nice -n 19, one thread (a 2-core machine shared with a training run).
set -e
SIM=../../build/sim/evoke-sim
t() { /usr/bin/time -f "%e s wall: $*" "$@"; }
# 1. Every task, policy and budget, 15 seeds, the model's default alignment (0.5).
t nice -n 19 $SIM --tasks niah,multifact,agentic \
  --policies recency,streaming_llm,h2o,snapkv,infllm,evoke --budgets 512,1024,2048 \
  --seeds 15 --threads 1 --out-dir full --probe-log full/probes.csv
# 2. Recovery-query alignment sweep: multifact at b = 1024, 15 seeds.
t nice -n 19 $SIM --tasks multifact --policies recency,h2o,infllm,evoke --budgets 1024 \
  --query-alignment 0,0.1,0.2,0.3,0.5,0.8,1 --seeds 15 --threads 1 \
  --out-dir alignment_b1024 --probe-log alignment_b1024/probes.csv
# 3. Full-cache ceiling: nothing evicted (budget above the session).
t nice -n 19 $SIM --tasks niah,multifact,agentic --policies recency --budgets 8192 \
  --seeds 15 --threads 1 --out-dir full_cache --probe-log full_cache/probes.csv
# 4. The far-but-resident needle: NIAH at large budgets, with the probe log.
t nice -n 19 $SIM --tasks niah --policies recency,evoke --budgets 1024,4096 \
  --seeds 15 --threads 1 --out-dir niah_far --probe-log niah_far/probes.csv

#!/bin/bash
# one core kept busy by another process while the session's new engine scenarios run (issue 20's done-when)
cd /work/main
python3 -c 'while True: pass' & BUSY=$!
echo "busy pid $BUSY, nproc $(nproc), start $(date -u +%FT%TZ), head $(git rev-parse --short HEAD)"
.venv/bin/python -m pytest -p no:cacheprovider -q --durations=0 \
  "tests/sim_engine/test_engine_sim.py::test_head_and_worker_swap_roles_and_back" \
  tests/sim_engine/test_engine_sim_nodes.py tests/sim_engine/test_engine_sim_renamed.py \
  tests/sim_engine/test_engine_sim_steps.py tests/sim_engine/test_engine_teardown.py; echo "engine rc=$?"
kill $BUSY; echo "end $(date -u +%FT%TZ)"

#!/usr/bin/env bash
# Dask batched LU over GPU workers against one GPU without Dask (issue 21, item 2):
# one run on a machine of 2 or 4 GPUs, the tables at the end of its output.
#
# On the GPU machine (the device tool), from a snapshot tree of this repository:
#   carry:   [".dev/remote-setup.sh", ".dev/debs", ".dev/wheels", ".dev/dask_wheels", ".dev/<tree>"]
#   command: cd .dev/<tree> && source ../remote-setup.sh && bash bench/dask_gpu_run.sh
#   kind:    nvidia-h200-x2 or nvidia-h100-x2 (workers 1, 2); nvidia-h100-x4 (1, 2, 4)
# Environment:
#   DASK_WHEELS  the wheels of dask, distributed and what the machine's image lacks of
#                their needs (default: ../dask_wheels, else .dev/dask_wheels), put in
#                /tmp/dask_site ahead of the image's packages
#   GPUS         GPUs to use (default: every visible one)
#   OUT          where the log and the JSON files go (the device tool sets it)
#   QUICK=1      only the main table at one setting (about 90 s)
# About 4-5 minutes on two H200: the direct run, the main table (1 and GPUS workers,
# worker-saturation 1.1 and inf, both calls, 1 and 4 batches in flight), two threads
# per worker on per-thread default streams (the default call), the Dask GPU tests.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dask_gpu_out}
mkdir -p "$OUT"
wheels=${DASK_WHEELS:-}
if [ -z "$wheels" ]; then
  for w in ../dask_wheels .dev/dask_wheels; do [ -d "$w" ] && { wheels=$w; break; }; done
fi
if ! python3 -c "import dask.distributed" 2>/dev/null; then
  [ -n "$wheels" ] || { echo "no Dask on this machine and no wheels (DASK_WHEELS)"; exit 2; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/dask_site "$wheels"/*.whl || exit 2
  export PYTHONPATH=/tmp/dask_site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
python3 -c "import dask, distributed, cupy, numpy; print('dask', dask.__version__, 'distributed', distributed.__version__, 'cupy', cupy.__version__, 'numpy', numpy.__version__)" || exit 2
nvidia-smi -L
ngpu=$(nvidia-smi -L | wc -l)
GPUS=${GPUS:-$ngpu}
workers=1,$GPUS
[ "$GPUS" -ge 4 ] && workers=1,2,$GPUS
bench="python3 bench/dask_batched.py --count 16777216 --n 32 --chunk 1048576 --reps 5"
rc=0
if [ "${QUICK:-0}" = 1 ]; then
  timeout 200 $bench --workers "$workers" --call async,default --batches 1,4 --saturation 1.1 \
    --json "$OUT/dask_main.json" --max-seconds 180 2>&1 | tee "$OUT/dask_main.log" || rc=1
else
  # the main table: the direct run first, then each cluster
  timeout 380 $bench --workers "$workers" --call async,default --batches 1,4 --saturation 1.1,inf \
    --json "$OUT/dask_main.json" --max-seconds 360 2>&1 | tee "$OUT/dask_main.log" || rc=1
  # two threads a worker, each on its own stream: a default call's wait is for its own chunk
  # (the async call cannot: its results cross threads unfinished)
  timeout 130 $bench --workers "$GPUS" --threads 2 --ptds --call default --batches 1,4 \
    --saturation 1.1 --no-direct --json "$OUT/dask_ptds.json" --max-seconds 120 2>&1 \
    | tee "$OUT/dask_ptds.log" || rc=1
fi
timeout 240 python3 -m pytest -q -m gpu tests/test_dask_throughput.py tests/test_distributed.py \
  2>&1 | tee "$OUT/dask_gpu_tests.log" | tail -15 || rc=1
echo
echo "== summary (per batch; efficiency = direct wall / (workers x Dask wall))"
for f in "$OUT"/dask_main.log "$OUT"/dask_ptds.log; do
  [ -f "$f" ] && { echo "-- $(basename "$f")"; grep -E '^\|' "$f"; grep -E 'checksums of every run' "$f"; }
done
tail -1 "$OUT/dask_gpu_tests.log"
exit $rc

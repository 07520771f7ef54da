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
#   DRY=1        a check of this script where there is no GPU: CPU workers, the GPU
#                modelled (bench/dask_batched.py --cpu --model-gpu), no GPU tests
#   QUICK=1      4 batches in flight only, no per-thread streams (about 3 min)
# About 6 minutes on two H200 (estimated; not run yet; pass timeout_s=600): the direct run,
# the main table (1 and GPUS workers, 1 and 2 threads a worker, both calls, one compute()
# and 4 batches in flight), 8 batches in flight, 2 threads a worker on per-thread default
# streams (the default call), the Dask GPU tests (the efficiencies of the last two runs
# against the main run's direct rows). Five files under $OUT: the main run's JSON and log,
# the other two runs' logs (their tables; their JSON stays in /tmp), the GPU tests' log. The efficiencies of the
# --no-direct runs are against the main run's direct rows (same call).
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
bench="python3 bench/dask_batched.py --count 16777216 --n 32 --chunk 1048576 --reps 5"
if [ "${DRY:-0}" = 1 ]; then
  python3 -c "import dask, distributed; print('dask', dask.__version__, 'distributed', distributed.__version__)" || exit 2
  ngpu=2
  bench="python3 bench/dask_batched.py --count 16777216 --n 4 --chunk 1048576 --reps 2 --cpu --model-gpu 8.87e-9"
else
  python3 -c "import dask, distributed, cupy, numpy; print('dask', dask.__version__, 'distributed', distributed.__version__, 'cupy', cupy.__version__, 'numpy', numpy.__version__)" || exit 2
  nvidia-smi -L || true
  ngpu=$(python3 -c "import cupy; print(cupy.cuda.runtime.getDeviceCount())")
fi
GPUS=${GPUS:-$ngpu}
workers=1,$GPUS
[ "$GPUS" -ge 4 ] && workers=1,2,$GPUS
rc=0
if [ "${QUICK:-0}" = 1 ]; then
  # 4 batches in flight, 1 and 2 threads a worker, both calls (about 2 minutes)
  timeout 240 $bench --workers "$workers" --threads 1,2 --call async,default --batches 4 \
    --saturation 1.1 --json "$OUT/dask_main.json" --max-seconds 220 2>&1 \
    | tee "$OUT/dask_main.log" || rc=1
else
  # the main table: the direct run first, then each cluster (1 and 2 threads a worker,
  # both calls, one compute() and 4 batches in flight)
  timeout 280 $bench --workers "$workers" --threads 1,2 --call async,default --batches 1,4 \
    --saturation 1.1 --json "$OUT/dask_main.json" --max-seconds 265 2>&1 \
    | tee "$OUT/dask_main.log" || rc=1
  # 8 batches in flight, 2 threads a worker
  timeout 80 $bench --workers "$GPUS" --threads 2 --call async,default --batches 8 \
    --saturation 1.1 --no-direct --direct-from "$OUT/dask_main.json" --json /tmp/dask_b8.json --max-seconds 75 2>&1 \
    | tee "$OUT/dask_b8.log" || rc=1
  # two threads a worker, each on its own stream: a default call's wait is for its own
  # chunk (the async call cannot: its results cross threads unfinished)
  timeout 70 $bench --workers "$GPUS" --threads 2 --ptds --call default --batches 1,4 \
    --saturation 1.1 --no-direct --direct-from "$OUT/dask_main.json" --json /tmp/dask_ptds.json --max-seconds 65 2>&1 \
    | tee "$OUT/dask_ptds.log" || rc=1
fi
if [ "${DRY:-0}" = 1 ]; then
  echo "DRY: no GPU tests" > "$OUT/dask_gpu_tests.log"
else
  timeout 90 python3 -m pytest -q -m gpu tests/test_dask_throughput.py tests/test_distributed.py \
    2>&1 | tee "$OUT/dask_gpu_tests.log" | tail -15 || rc=1
fi
echo
echo "== summary (per batch; efficiency = direct wall / (workers x Dask wall))"
for f in "$OUT"/dask_main.log "$OUT"/dask_b8.log "$OUT"/dask_ptds.log; do
  [ -f "$f" ] && { echo "-- $(basename "$f")"; grep -E '^\|' "$f"; grep -E 'checksums of every run' "$f"; }
done
tail -1 "$OUT/dask_gpu_tests.log"
exit $rc

#!/usr/bin/env bash
# GPU check of the kernels: the GPU-marked kernel tests, the whole kernel suite natively on CUDA,
# and the benchmark. Results land in $OUT (default ./gpu_results/<UTC date>), with the date, the
# device and the exact commands, ready to commit.
#
#   OUT=/some/dir scripts/gpu_check.sh            # full benchmark grid
#   QUICK=1 scripts/gpu_check.sh                  # small benchmark grid (fits a 10-minute slot)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_results/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"

python - <<'PY' > "$OUT/env.txt" 2>&1
import datetime, torch, triton, platform
print("date:", datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
print("device:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO CUDA DEVICE")
print("torch:", torch.__version__, "cuda:", torch.version.cuda, "triton:", triton.__version__)
print("python:", platform.python_version())
PY
cat "$OUT/env.txt"
if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device: nothing to do (CPU runs use: pytest -n 2 tests/kernels)" | tee "$OUT/summary.txt"
    exit 2
fi
git rev-parse HEAD > "$OUT/commit.txt" 2>/dev/null || true

status=0
cmd1="python -m pytest -q -m gpu tests/kernels --junitxml=$OUT/gpu_tests.xml"
echo "\$ $cmd1" | tee "$OUT/gpu_tests.txt"
$cmd1 2>&1 | tee -a "$OUT/gpu_tests.txt" || status=1

cmd2="python -m pytest -q tests/kernels -m 'not gpu' --junitxml=$OUT/tests.xml"
echo "\$ $cmd2" | tee "$OUT/tests.txt"
python -m pytest -q tests/kernels -m 'not gpu' --junitxml="$OUT/tests.xml" 2>&1 | tee -a "$OUT/tests.txt" || status=1

bench_flags=""
[ "${QUICK:-0}" = "1" ] && bench_flags="--quick"
cmd3="python bench/kernels.py $bench_flags --json $OUT/bench.json"
echo "\$ $cmd3" | tee "$OUT/bench.txt"
$cmd3 2>&1 | tee -a "$OUT/bench.txt" || status=1

{
    cat "$OUT/env.txt"
    echo "commands:"; echo "  $cmd1"; echo "  $cmd2"; echo "  $cmd3"
    echo "gpu tests: $(tail -n 1 "$OUT/gpu_tests.txt")"
    echo "all tests: $(tail -n 1 "$OUT/tests.txt")"
    grep -E "target|copy bandwidth" "$OUT/bench.txt" || true
    echo "exit status: $status"
} > "$OUT/summary.txt"
cat "$OUT/summary.txt"
exit $status

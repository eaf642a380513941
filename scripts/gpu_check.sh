#!/usr/bin/env bash
# The GPU check of issue 17, in ONE call that fits 10 minutes and writes exactly 8 files under $OUT:
#
#   env.txt           date, device, driver, versions, commit, how pagedkv was installed, imports
#   kernel_tests.txt  pytest tests/kernels (fp32, fp16, bf16, the gpu-marked larger shapes) + the kit's tests
#   checks.json       pagedkv check --only kernels --only kernel-state on CUDA (JSON; table in summary)
#   replay.txt        one generated corpus replayed against pagedkv's kernels, the kit's minimal kernel
#                     and its planted tile-offset twin (which must FAIL), in fp32/fp16/bf16
#   demo.txt          pagedkv demo (the engine scenarios) on CUDA
#   probes.txt        compute-sanitizer memcheck over NaN-poisoned cases on exactly-sized caches,
#                     then a CUDA-graph capture and replay of a decode step
#   bench.json        bench/kernels.py (written after every row, so a cut-short run keeps its rows)
#   summary.txt       every command with its exit status and the tails that matter, the bench table
#
# The device is offline (Python 3.12, torch, Triton, numpy, pytest, hypothesis, rich, click, xxhash;
# no z3-solver, crosshair-tool, redis, matplotlib): pagedkv installs with --no-deps, and if even that
# is impossible (no setuptools) it is put on PYTHONPATH as a tree of links. Each step has its own
# time limit (T_* below, seconds; they sum to 570) so one slow step cannot eat the others.
#
#   OUT=/some/dir scripts/gpu_check.sh        # default OUT: gpu_results/<UTC time>
#   CPU_DRY_RUN=1 KERNEL_TESTS=tests/kernels/test_check.py scripts/gpu_check.sh
#                                             # every step on a CPU (interpreter, bench --smoke): tests the script
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-gpu_results/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT"
T_GPU_TESTS="${T_GPU_TESTS:-100}" T_TESTS="${T_TESTS:-90}" T_CHECK="${T_CHECK:-70}" T_CORPUS="${T_CORPUS:-30}" T_REPLAY="${T_REPLAY:-45}"
T_PLANTED="${T_PLANTED:-30}" T_DEMO="${T_DEMO:-30}" T_PROBES="${T_PROBES:-60}" T_GRAPH="${T_GRAPH:-25}"
T_BENCH="${T_BENCH:-90}" BENCH_GRID="${BENCH_GRID:-full}"
GPU_TESTS="${GPU_TESTS:-tests/kernels}"
KERNEL_TESTS="${KERNEL_TESTS:-tests/kernels tests/fuzz/test_kernel_kit.py}"
CPU_DRY_RUN="${CPU_DRY_RUN:-0}"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

# ---- install (no registry) ------------------------------------------------------------------------
install_note="already importable"
if ! python -c "import pagedkv.kernels" >/dev/null 2>&1; then
    if pip install --no-deps --no-build-isolation -e . >/tmp/pagedkv_install.log 2>&1; then
        install_note="pip install --no-deps --no-build-isolation -e ."
    else
        # The package maps rooms to folders (pyproject [tool.setuptools.package-dir]): mirror that map.
        tree=/tmp/pagedkv_tree/pagedkv
        rm -rf /tmp/pagedkv_tree && mkdir -p "$tree"
        ln -s "$ROOT"/cli/top/*.py "$tree/"
        for room in cli spec impl kernels proofs fuzz; do ln -s "$ROOT/$room" "$tree/$room"; done
        export PYTHONPATH="/tmp/pagedkv_tree${PYTHONPATH:+:$PYTHONPATH}"
        install_note="pip failed ($(tail -n 1 /tmp/pagedkv_install.log)); PYTHONPATH link tree /tmp/pagedkv_tree"
    fi
fi
export PYTHONUNBUFFERED=1

# run NAME LIMIT FILE CMD...: run CMD under a time limit, output to FILE, status to the summary
run() {
    local name="$1" limit="$2" file="$3"; shift 3
    echo "\$ $*" >> "$file"
    local start=$SECONDS
    timeout --kill-after=5 "$limit" "$@" >> "$file" 2>&1
    local rc=$?
    local why=""; [ $rc -eq 124 ] || [ $rc -eq 137 ] && why=" (TIME LIMIT ${limit}s)"
    echo "[$name] exit $rc$why in $((SECONDS - start))s: $*" | tee -a "$SUMMARY"
    return $rc
}

# ---- 1. environment ---------------------------------------------------------------------------------
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown) $(git status --porcelain 2>/dev/null | wc -l) changed paths"
    echo "install: $install_note"
    nvidia-smi -L 2>&1 || echo "nvidia-smi: not found"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv 2>&1 || true
    python - <<'PY'
import importlib.util, platform, torch, triton
print("python", platform.python_version(), "| torch", torch.__version__, "cuda", torch.version.cuda,
      "| triton", triton.__version__)
print("device:", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO CUDA DEVICE")
for name in ("numpy", "pytest", "hypothesis", "rich", "click", "xxhash", "z3", "crosshair", "redis", "matplotlib"):
    print(f"  {name}: {'present' if importlib.util.find_spec(name) else 'absent'}")
import pagedkv.kernels, pagedkv.fuzz.kernel_kit.check  # the kernel suite needs neither z3 nor crosshair
print("pagedkv kernels and kernel kit import: ok")
PY
    SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)"
    echo "compute-sanitizer: ${SAN:-not found}"
    [ -n "$SAN" ] && "$SAN" --version 2>&1 | tail -n 1
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" >> "$SUMMARY"
if [ "$CPU_DRY_RUN" != 1 ] && ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "no CUDA device: nothing to measure (CPU runs: pytest tests/kernels; bench/kernels.py --smoke)" | tee -a "$SUMMARY"
    exit 2
fi
SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)"
PROBE_DTYPE=bfloat16; [ "$CPU_DRY_RUN" = 1 ] && PROBE_DTYPE=float32   # the interpreter has no bfloat16
status=0

# ---- 2. the kernel suite on CUDA: the gpu-marked shapes and bf16 first (never run before), then the rest
# shellcheck disable=SC2086  # GPU_TESTS and KERNEL_TESTS are lists of paths
if [ "$CPU_DRY_RUN" = 1 ]; then
    echo "[gpu-tests] not run: CPU dry run (the gpu-marked tests need CUDA)" | tee -a "$SUMMARY"
else
    run gpu-tests "$T_GPU_TESTS" "$OUT/kernel_tests.txt" python -m pytest -v --tb=short -p no:cacheprovider -rfE \
        -m gpu $GPU_TESTS || status=1
fi
# shellcheck disable=SC2086
run tests "$T_TESTS" "$OUT/kernel_tests.txt" python -m pytest -v --tb=short -p no:cacheprovider -rfE \
    -m "not gpu" $KERNEL_TESTS || status=1
grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$OUT/kernel_tests.txt" | tail -n 25 >> "$SUMMARY"

# ---- 3. kernels + kernel-state checks on CUDA -------------------------------------------------------
export PAGEDKV_KERNEL_FAILURES=/tmp/pagedkv_gpu_check_failures.jsonl   # copied into the summary below
rm -f "$PAGEDKV_KERNEL_FAILURES"
run checks "$T_CHECK" "$SUMMARY" python -m pagedkv check --only kernels --only kernel-state --profile ci \
    --json "$OUT/checks.json" || status=1

# ---- 4. one corpus, several kernels ------------------------------------------------------------------
CORPUS=/tmp/pagedkv_gpu_corpus
rm -rf "$CORPUS"
run corpus "$T_CORPUS" "$OUT/replay.txt" python -m pagedkv gen-kernel-tests --out "$CORPUS" --count 20 --seed 17 \
    --grid ci --dtype float32 --dtype float16 --dtype bfloat16 || status=1
run replay "$T_REPLAY" "$OUT/replay.txt" python -m pagedkv.fuzz.kernel_kit.replay "$CORPUS" \
    --kernel pagedkv --kernel pagedkv.fuzz.kernel_kit.minimal:factory --failures /tmp/pagedkv_gpu_failures.jsonl \
    || status=1
run planted "$T_PLANTED" "$OUT/replay.txt" python -m pagedkv.fuzz.kernel_kit.replay "$CORPUS" --dtype "$PROBE_DTYPE" \
    --kernel pagedkv.fuzz.kernel_kit.minimal:tile_offset_bug --failures /tmp/pagedkv_gpu_planted.jsonl
[ $? -eq 1 ] && echo "[planted] failed as it must (exit 1)" >> "$SUMMARY" \
             || { echo "[planted] DID NOT FAIL: the corpus lost its teeth" >> "$SUMMARY"; status=1; }
grep -E "passed, .* skipped, .* failed" "$OUT/replay.txt" >> "$SUMMARY"

# ---- 5. the engine demo on CUDA -----------------------------------------------------------------------
run demo "$T_DEMO" "$OUT/demo.txt" python -m pagedkv demo || status=1
tail -n 12 "$OUT/demo.txt" >> "$SUMMARY"

# ---- 6. memcheck on exactly-sized caches, then a CUDA graph ------------------------------------------
if [ -n "$SAN" ]; then
    run memcheck "$T_PROBES" "$OUT/probes.txt" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "$SAN" --tool memcheck \
        --leak-check no --error-exitcode 3 python scripts/gpu_probes.py memcheck --dtype "$PROBE_DTYPE" || status=1
else
    echo "compute-sanitizer not found: memcheck cases run without it" >> "$OUT/probes.txt"
    run memcheck "$T_PROBES" "$OUT/probes.txt" python scripts/gpu_probes.py memcheck --dtype "$PROBE_DTYPE" || status=1
fi
run graph "$T_GRAPH" "$OUT/probes.txt" python scripts/gpu_probes.py graph --dtype "$PROBE_DTYPE" || status=1
grep -E "^(ok|FAIL)|ERROR SUMMARY|Invalid" "$OUT/probes.txt" | head -n 20 >> "$SUMMARY"

# ---- 7. the benchmark -----------------------------------------------------------------------------------
bench_size=(--grid "$BENCH_GRID"); [ "$CPU_DRY_RUN" = 1 ] && bench_size=(--smoke)
run bench "$T_BENCH" "$SUMMARY" python bench/kernels.py "${bench_size[@]}" --json "$OUT/bench.json" || status=1

if [ -s "$PAGEDKV_KERNEL_FAILURES" ] || [ -s /tmp/pagedkv_gpu_failures.jsonl ]; then
    # replayable failure cases (a corpus: header line, then cases): commit them to tests/fuzz/kernel_regressions.jsonl
    echo "---- saved failure cases (JSON lines) ----" >> "$SUMMARY"
    cat "$PAGEDKV_KERNEL_FAILURES" /tmp/pagedkv_gpu_failures.jsonl 2>/dev/null >> "$SUMMARY"
fi
echo "exit status: $status" >> "$SUMMARY"
ls "$OUT" >> "$SUMMARY"
tail -n 60 "$SUMMARY"
exit $status

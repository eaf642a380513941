"""The kernels lower all the way to a cubin for sm_90 (bf16, split-KV, cache ops) even on a CPU
machine: catches errors only the real GPU compiler sees. Runs in a subprocess because this process
decorated the kernels for the interpreter."""

import os
import subprocess
import sys


def test_kernels_compile_for_sm90():
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DEFAULT_FP_FUSION="1")
    proc = subprocess.run([sys.executable, "-m", "pagedkv.kernels.aot_check", "90", "--quick"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "compiled 4 kernel variants" in proc.stdout

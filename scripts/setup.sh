#!/usr/bin/env bash
# One-time set-up on a fresh machine: pagedkv and its test tools, a CPU build of torch, redis-server.
# Safe to re-run: pip and apt skip what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

# torch first and pinned: this exact release is a CPU wheel on our machines, whereas an unpinned
# torch (asked for by triton or by us) would pull a multi-GB CUDA build.
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    "$PYTHON" -m pip install --quiet "torch==2.13.0"
fi
"$PYTHON" -m pip install --quiet -e ".[test]"

# redis-server backs the multi-machine fuzz campaign test; the tests start it on 127.0.0.1 themselves.
if ! command -v redis-server >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    else
        echo "setup: redis-server not found and cannot apt-get it; the redis campaign test will fail" >&2
    fi
fi

#!/usr/bin/env bash
# One-time set-up on a fresh machine: pagedkv and its test tools, a CPU build of torch, redis-server (as root).
# Safe to re-run: pip and apt skip what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"

# Every Python package at the version it was tested with (scripts/constraints.txt). No root needed:
# run this inside a virtual environment (python3 -m venv .venv && . .venv/bin/activate).
CONSTRAINTS=scripts/constraints.txt

# torch first and pinned: this exact release is a CPU wheel on our machines, whereas an unpinned
# torch (asked for by triton or by us) would pull a multi-GB CUDA build.
if ! "$PYTHON" -c "import torch" 2>/dev/null; then
    "$PYTHON" -m pip install --quiet -c "$CONSTRAINTS" torch
fi
"$PYTHON" -m pip install --quiet -c "$CONSTRAINTS" -e ".[test,engines]"

# redis-server backs the Redis campaign tests (tests/fuzz/test_redis_campaign.py; they start it on
# 127.0.0.1). It comes from apt, so only root can install it here; without it those tests are
# skipped, each saying why.
if ! command -v redis-server >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    else
        echo "setup: redis-server is not installed and installing it needs root (apt-get install redis-server);" \
             "the Redis campaign tests will be skipped, everything else runs" >&2
    fi
fi

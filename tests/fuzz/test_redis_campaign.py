"""Many machines, one Redis: a counterexample one worker finds is replayed by the next.

Starts a real `redis-server` on 127.0.0.1 (CI installs it from Debian); skips only if the binary is absent.
"""

import json
import shutil
import socket
import subprocess
import time

import pytest

from test_campaign import BUG, fuzz

pytestmark = pytest.mark.redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path):
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    port = free_port()
    server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(10)


def test_second_worker_replays_what_the_first_found(tmp_path, redis_url):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()  # separate machines: nothing shared but the Redis server
    first = fuzz(tmp_path / "a", BUG, "--db", redis_url, "--json", "out.json")
    assert first.returncode == 1, first.stdout + first.stderr
    assert "unreachable" not in first.stdout
    second = fuzz(tmp_path / "b", BUG, "--db", redis_url, "--max-examples", "1", "--json", "out.json")
    assert second.returncode == 1, second.stdout + second.stderr
    found, replayed = (json.loads((tmp_path / d / "out.json").read_text())["failure"] for d in "ab")
    assert replayed["found_in"] == "replay"
    assert replayed["program"] == found["program"] and replayed["oracle"] == found["oracle"]


def test_unreachable_redis_falls_back_to_a_local_database(tmp_path):
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    run = fuzz(tmp_path, "spec", "--db", url, "--max-examples", "10", "--json", "out.json")
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"Redis at {url} is unreachable" in run.stdout and "local database" in run.stdout
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["database"] == ".hypothesis/pagedkv" and "unreachable" in result["database_note"]

"""Many machines, one Redis: a counterexample one worker finds is replayed by the next; every URL
form the Redis client knows works or is refused clearly, and no password is ever shown or stored.

Starts real `redis-server`s on 127.0.0.1 (CI installs it from Debian; TLS with a throwaway
self-signed certificate from `openssl`); skips only if a binary is absent.
"""

import json
import shutil
import socket
import subprocess
import time

import pytest
from click.testing import CliRunner

from pagedkv.cli.fuzz import fuzz as fuzz_command
from pagedkv.fuzz.campaign import masked
from test_campaign import BUG, fuzz

pytestmark = pytest.mark.redis
SECRET = "hunter2-s3cret"


@pytest.fixture(autouse=True)
def in_tmp_path(tmp_path, monkeypatch):
    """In-process campaigns that fall back to the local database write it under tmp_path."""
    monkeypatch.chdir(tmp_path)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(connect, what: str) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            connect().close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"redis-server did not start ({what})"
            time.sleep(0.05)


@pytest.fixture
def redis_server(tmp_path):
    """start(*args) -> port: a redis-server on 127.0.0.1 with `args`; all stopped after the test."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (scripts/setup.sh installs it when run as root)")
    servers = []

    def start(*args, port=None):
        port = port or free_port()
        servers.append(subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                         "--appendonly", "no", "--dir", str(tmp_path), *args],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return port
    yield start
    for server in servers:
        server.terminate()
        server.wait(10)


@pytest.fixture
def redis_url(redis_server):
    port = redis_server()
    wait_for(lambda: socket.create_connection(("127.0.0.1", port), timeout=0.2), "tcp")
    return f"redis://127.0.0.1:{port}/0"


def invoke(*args):
    return CliRunner().invoke(fuzz_command, list(args))


def spec_run(tmp_path, url):
    """A short passing campaign against `url`: (CliRunner result, its JSON report or None)."""
    report = tmp_path / f"out{time.monotonic_ns()}.json"
    run = invoke("spec", "--max-examples", "3", "--db", url, "--json", str(report))
    return run, (json.loads(report.read_text()) if report.exists() else None)


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


def test_unreachable_redis_falls_back_to_a_local_database_and_masks_the_password(tmp_path):
    url = f"redis://:{SECRET}@127.0.0.1:{free_port()}/0"  # nothing listens there
    run, result = spec_run(tmp_path, url)
    assert run.exit_code == 0, run.output
    shown = f"redis://:***@127.0.0.1:{url.rsplit(':', 1)[1]}"
    assert f"Redis at {shown} is unreachable" in run.output and "local database" in run.output
    assert result["database"] == ".hypothesis/pagedkv" and "unreachable" in result["database_note"]
    assert SECRET not in run.output and SECRET not in json.dumps(result)


def test_a_password_protected_redis_accepts_the_right_password_and_never_shows_it(tmp_path, redis_server):
    port = redis_server("--requirepass", SECRET)
    wait_for(lambda: socket.create_connection(("127.0.0.1", port), timeout=0.2), "tcp")
    run, result = spec_run(tmp_path, f"redis://:{SECRET}@127.0.0.1:{port}/0")
    assert run.exit_code == 0, run.output
    assert result["database"] == f"redis://:***@127.0.0.1:{port}/0" and not result["database_note"]
    assert SECRET not in run.output and SECRET not in json.dumps(result)
    for url in (f"redis://:wrong-{SECRET}@127.0.0.1:{port}/0", f"redis://127.0.0.1:{port}/0",
                f"redis://default:wrong-{SECRET}@127.0.0.1:{port}/0"):
        run, result = spec_run(tmp_path, url)
        assert run.exit_code == 2, run.output          # not "unreachable", not a silent local fallback
        assert "Redis refused the credentials" in run.output and result is None
        assert SECRET not in run.output


def test_every_scheme_the_client_knows_works_in_any_case(tmp_path, redis_server):
    port = redis_server()
    socket_path = tmp_path / "redis.sock"
    redis_server("--unixsocket", str(socket_path), port=free_port())
    wait_for(lambda: socket.create_connection(("127.0.0.1", port), timeout=0.2), "tcp")
    wait_for(lambda: _unix(socket_path), "unix socket")
    for url in (f"REDIS://127.0.0.1:{port}/1", f"Redis://127.0.0.1:{port}", f"unix://{socket_path}?db=2",
                f"UNIX://{socket_path}"):
        run, result = spec_run(tmp_path, url)
        assert run.exit_code == 0, (url, run.output)
        assert result["database"] == url and not result["database_note"], url


def _unix(path):
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(0.2)
    sock.connect(str(path))
    return sock


def test_rediss_speaks_tls(tmp_path, redis_server):
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    port = free_port()
    redis_server("--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                 "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no", port=free_port())
    wait_for(lambda: socket.create_connection(("127.0.0.1", port), timeout=0.2), "tls")
    run, result = spec_run(tmp_path, f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}&ssl_check_hostname=false")
    assert run.exit_code == 0 and not result["database_note"], run.output
    run, result = spec_run(tmp_path, f"redis://127.0.0.1:{port}/0")  # plain text to a TLS port
    assert run.exit_code == 0 and "is unreachable" in result["database_note"], run.output


@pytest.mark.parametrize("url, says", [
    ("http://127.0.0.1:6379/0", "unknown scheme http://"),
    ("redis://127.0.0.1:notaport/0", "is not a valid Redis URL"),
    ("redis://127.0.0.1:99999/0", "is not a valid Redis URL"),
    ("redis://127.0.0.1:6379/zero", "the path must be a database number"),
    (f"redis://:{SECRET}@127.0.0.1:6379/0?socket_timeout=soon", "is not a valid Redis URL"),
])
def test_a_malformed_url_is_a_usage_error(url, says):
    run = invoke("spec", "--db", url)
    assert run.exit_code == 2, run.output
    assert says in run.output and SECRET not in run.output


def test_a_database_number_the_server_lacks_is_a_usage_error(tmp_path, redis_url):
    run, _ = spec_run(tmp_path, redis_url.rsplit("/", 1)[0] + "/99")
    assert run.exit_code == 2 and "Redis refused the connection" in run.output, run.output


@pytest.mark.parametrize("url, shown", [
    (f"redis://:{SECRET}@host:1/0", "redis://:***@host:1/0"),
    (f"rediss://user:{SECRET}@host/0", "rediss://user:***@host/0"),
    (f"unix:///run/redis.sock?db=1&password={SECRET}", "unix:///run/redis.sock?db=1&password=***"),
    ("redis://:p%40ss@host/0", "redis://:***@host/0"),
    ("redis://host:6379/0", "redis://host:6379/0"),
])
def test_masked_hides_every_password_form(url, shown):
    assert masked(url) == shown
    assert masked(url, "error talking to p@ss" if "%40" in url else "x") in ("error talking to ***", "x")

"""Shared fixtures: in-test fake RPC servers, and the real conductor binary for e2e tests.

End-to-end tests take the ``conductor`` fixture; it skips when no binary is found
(``CONDUCTOR_BIN``, else ``bin/mooncake_conductor`` at the repository root).
"""

import contextlib
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from fake_server import FakeServer
from mooncake.conductor import OK, ConductorClient

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_server():
    """Factory: fake_server(handler, host=..., family=...) -> FakeServer, stopped at teardown.

    The test fails if a server recorded a protocol error (bad header, handler exception).
    """
    servers = []
    with contextlib.ExitStack() as stack:

        def make(handler, **kwargs):
            srv = FakeServer(handler, **kwargs)
            stack.callback(srv.stop)
            servers.append(srv)
            return srv

        yield make
    errors = [e for srv in servers for e in srv.errors]
    assert not errors, errors


@pytest.fixture
def served_client(fake_server):
    """Factory: served_client(handler) -> (FakeServer, ConductorClient set up on it); the
    clients are closed at teardown, before their servers stop."""
    with contextlib.ExitStack() as stack:

        def make(handler):
            srv = fake_server(handler)
            client = stack.enter_context(ConductorClient())
            assert client.setup(srv.address) == OK
            return srv, client

        yield make


def free_port():
    """A TCP port that was free a moment ago (the binary binds it itself)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def conductor_bin():
    """Path of the conductor binary, or skip the test when it has not been built."""
    path = os.environ.get("CONDUCTOR_BIN") or str(REPO_ROOT / "bin" / "mooncake_conductor")
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        pytest.skip("conductor binary not built (set CONDUCTOR_BIN or run `make build`): %s" % path)
    return path


class RunningConductor:
    """A conductor process started for one test: its RPC and HTTP addresses."""

    def __init__(self, proc, rpc_port, http_port, log_path):
        self.proc = proc
        self.rpc_port = rpc_port
        self.http_port = http_port
        self.rpc_addr = "127.0.0.1:%d" % rpc_port
        self.http_url = "http://127.0.0.1:%d" % http_port
        self.log_path = log_path

    def log(self):
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""


@pytest.fixture
def conductor(conductor_bin, tmp_path):
    """Start the binary with an empty service list on free ports; stop it afterwards."""
    rpc_port, http_port = free_port(), free_port()
    config = tmp_path / "conductor.json"
    config.write_text(json.dumps({"http_server_port": http_port, "rpc_server_port": rpc_port, "kvevent_instance": {}}))
    log_path = tmp_path / "conductor.log"
    env = dict(os.environ, CONDUCTOR_CONFIG_PATH=str(config))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([conductor_bin], env=env, stdout=log, stderr=subprocess.STDOUT)
    running = RunningConductor(proc, rpc_port, http_port, log_path)
    try:
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                pytest.fail("conductor exited with %s:\n%s" % (proc.returncode, running.log()))
            try:
                socket.create_connection(("127.0.0.1", rpc_port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("conductor RPC port %d never opened:\n%s" % (rpc_port, running.log()))
                time.sleep(0.05)
        yield running
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

"""The README's quick start, run as written against the real binary.

python/examples/vllm_publisher.py stands in for a vLLM engine that holds tokens 1..32;
the publisher is registered and the prompt 1..40 queried through conductorctl and through
ConductorClient, and each must print what the README's output blocks show. A change to the
event format, the CLI's table or the client's result that the README does not follow
fails here.
"""

import ast
import re
import selectors
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, free_port
from mooncake.conductor import OK, ConductorClient
from test_e2e import wait_for

PUBLISHER = REPO_ROOT / "python" / "examples" / "vllm_publisher.py"
PROFILE = {"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"}

README = REPO_ROOT / "README.md"


def readme_output(first):
    """The README's ```text block that starts with first: an output it promises."""
    blocks = re.findall(r"```text\n(.*?)```", README.read_text(), re.S)
    found = [b for b in blocks if b.startswith(first)]
    assert len(found) == 1, "README.md has %d text blocks starting with %r" % (len(found), first)
    return found[0]


def read_line(proc, timeout=15.0):
    """The publisher's next stdout line (it prints one per step), or fail after timeout."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        if not sel.select(timeout):
            pytest.fail("publisher printed nothing within %.0fs" % timeout)
        return proc.stdout.readline().decode()
    finally:
        sel.close()


@pytest.fixture
def publisher():
    endpoint = "tcp://127.0.0.1:%d" % free_port()
    proc = subprocess.Popen(
        [sys.executable, str(PUBLISHER), "--endpoint", endpoint], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        line = read_line(proc)
        assert line.startswith("publishing on %s" % endpoint), line
        yield proc, endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def conductorctl(conductor_bin):
    path = Path(conductor_bin).parent / "conductorctl"
    if not path.is_file():
        path = REPO_ROOT / "bin" / "conductorctl"
    if not path.is_file():
        pytest.skip("conductorctl not built (make build)")
    return str(path)


def test_quickstart_conductorctl(conductor, conductor_bin, publisher):
    proc, endpoint = publisher
    ctl = [conductorctl(conductor_bin), "--addr", conductor.http_url]
    out = subprocess.run(
        ctl + ["register", "--endpoint", endpoint, "--type", "vLLM", "--model", "demo", "--instance", "engine-0",
               "--block-size", "16", "--algorithm", "sha256_cbor", "--seed", "0"],
        capture_output=True, text=True, check=True,
    ).stdout
    promised = readme_output("status").splitlines(keepends=True)
    assert out == "".join(promised[:2])
    assert read_line(proc) == "sent seq 0: BlockStored, 2 blocks (tokens 1..32)\n"
    query = ctl + ["query", "--model", "demo", "--block-size", "16", "--tokens", ",".join(map(str, range(1, 41)))]
    wait_for(lambda: subprocess.run(query, capture_output=True, text=True, check=True).stdout,
             lambda out: out == "".join(promised[2:]), what="the README's conductorctl query output")


def test_quickstart_python(conductor, publisher):
    proc, endpoint = publisher
    with ConductorClient() as c:
        assert c.setup(conductor.rpc_addr) == OK
        assert c.register({"instance_id": "engine-0", "endpoint": endpoint, "model_name": "demo", "block_size": 16,
                           "hash_profile": dict(PROFILE)}) == OK
        assert read_line(proc) == "sent seq 0: BlockStored, 2 blocks (tokens 1..32)\n"
        promised = ast.literal_eval(readme_output("{'ret'"))
        wait_for(lambda: c.query("demo", block_size=16, token_ids=list(range(1, 41))),
                 lambda res: res == promised, what="the README's Python query result")

"""End to end: the client against the real conductor binary (skipped when it is not built).

These follow python-client-api.txt. Registration points at a ZMQ endpoint where no
publisher runs: subscribing is asynchronous, so it succeeds and the instance shows up
in the views with zero counts.
"""

import copy

import pytest

import goldens as g
from mooncake.conductor import (
    HEALTH_OK,
    INVALID_PARAMS,
    OK,
    SERVICE_NOT_FOUND,
    ConductorClient,
)


@pytest.fixture
def client(conductor):
    with ConductorClient() as c:
        assert c.setup(conductor.rpc_addr) == OK, conductor.log()
        yield c


def test_empty_index(client):
    assert client.health_check() == HEALTH_OK
    assert client.query("my-model", block_size=16, token_ids=list(range(32))) == {"ret": OK, "hits": {}}
    assert client.query("my-model", block_size=16, token_ids=[]) == {"ret": OK, "hits": {}}
    assert client.list_services() == {"ret": OK, "count": 0, "services": []}
    assert client.get_global_view() == {"ret": OK, "context_count": 0, "contexts": []}


def test_invalid_requests(client):
    assert client.query("", block_size=16, token_ids=[1])["ret"] == INVALID_PARAMS
    assert client.query("m", block_size=0, token_ids=[1])["ret"] == INVALID_PARAMS
    assert client.query("m", block_size=-16, token_ids=[1])["ret"] == INVALID_PARAMS
    assert client.register({}) == INVALID_PARAMS
    assert client.register(dict(g.REGISTER_CONFIG, block_size=0)) == INVALID_PARAMS
    assert client.unregister("nobody") == SERVICE_NOT_FOUND


def test_register_view_query_unregister(client):
    cfg = copy.deepcopy(g.REGISTER_CONFIG)
    cfg.update(instance_id="vllm-0", endpoint="tcp://127.0.0.1:1", tenant_id="")
    assert client.register(cfg) == OK
    assert client.register(cfg) == OK  # identical duplicate succeeds

    services = client.list_services()
    assert services["ret"] == OK and services["count"] == 1
    svc = services["services"][0]
    assert svc["InstanceID"] == "vllm-0" and svc["TenantID"] == "default" and svc["Type"] == "vLLM"
    assert svc["HashProfile"]["root_digest"] == g.ROOT_VLLM_CBOR_SEED0
    assert svc["CacheGroup"] is None

    view = client.get_global_view()
    assert view["ret"] == OK and view["context_count"] == 1
    ctx = view["contexts"][0]
    assert (ctx["model_name"], ctx["tenant_id"], ctx["block_size"]) == ("m", "default", 16)
    assert ctx["instances"] == {"vllm-0": {0}}

    result = client.query("m", block_size=16, token_ids=list(range(32)))
    assert result["ret"] == OK
    hit = result["hits"]["vllm-0"]
    assert hit["longest_matched"] == hit["disk"] == 0
    assert hit["device"] == hit["cpu_local"] == hit["cpu_share"] == 0

    assert client.unregister("vllm-0", "", 0) == OK
    assert client.unregister("vllm-0") == SERVICE_NOT_FOUND
    assert client.list_services()["count"] == 0

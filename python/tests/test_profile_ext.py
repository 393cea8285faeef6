"""The hash_profile fields of issue 25, index_media and multi-LoRA through the client:
this conductor's RegisterEx / UnregisterAdapter / ListServiceDetails, and the upstream
methods, byte for byte, for everything else."""

import hashlib

import pytest

import goldens as g
from fake_server import Reply
from mooncake import _conductor_wire as w
from mooncake.conductor import INVALID_PARAMS, OK, RPC_FAIL, SERVICE_NOT_FOUND, ConductorClient
from test_e2e import VLLM_PROFILE, client, publisher_factory, vllm_config, zmq_ctx  # noqa: F401 (fixtures)

# struct_pack type literals (one byte per type id; structs bracketed by 253 ... 255), as
# the Go tests derive the codes: a code is the first 4 MD5 bytes, big-endian, bit 0 clear.
_STR, _I32, _I64 = bytes([128, 12]), bytes([1]), bytes([3])


def _struct(*members):
    return bytes([253]) + b"".join(members) + bytes([255])


def _code(literal):
    return int.from_bytes(hashlib.md5(literal).digest()[:4], "big") & ~1


def test_type_codes_from_structure():
    profile = _struct(*[_STR] * 5)
    config = _struct(_STR, _STR, _I32, _STR, _STR, _STR, _STR, _I64, _I32, bytes([133]) + _I64, profile)
    ext = _struct(_STR, _STR, _I64)
    assert _code(config) == w.TC_SERVICE_CONFIG  # the literal rules, on an upstream type
    assert _code(_struct(config, ext, bytes([133, 132]) + _STR)) == w.TC_REGISTER_EX_ARGS
    assert _code(_struct(_STR, _STR, _I32, _STR)) == w.TC_UNREGISTER_ADAPTER_ARGS
    assert _code(bytes([132]) + _struct(config, ext, bytes([132]) + _STR, _STR)) == w.TC_SERVICE_DETAIL_LIST


@pytest.fixture
def recording(served_client):
    """A server that answers every register and unregister OK and records the calls."""

    def handler(req):
        if req.func_id in (w.FUNC_REGISTER, w.FUNC_REGISTER_EX):
            return w.encode(w.REGISTER_RESPONSE, w.TC_REGISTER_RESPONSE, (True, ("e", True)))
        if req.func_id in (w.FUNC_UNREGISTER, w.FUNC_UNREGISTER_ADAPTER):
            return w.encode(w.UNREGISTER_RESPONSE, w.TC_UNREGISTER_RESPONSE, (True, ("e|default|0",)))
        raise AssertionError("unexpected function 0x%08x" % req.func_id)

    return served_client(handler)


def test_register_sends_upstream_body_without_new_fields(recording):
    srv, c = recording
    assert c.register(g.REGISTER_CONFIG) == OK
    assert (srv.requests[-1].func_id, srv.requests[-1].body) == (w.FUNC_REGISTER, g.REGISTER_ARGS)


def test_register_ex_carries_new_fields(recording):
    srv, c = recording
    cfg = dict(g.REGISTER_CONFIG, index_media=["GPU", "CPU"])
    cfg["hash_profile"] = dict(cfg["hash_profile"], extra_keys="tagged", lora_path="/adapters/a", lookahead_tokens=1)
    assert c.register(cfg) == OK
    req = srv.requests[-1]
    assert req.func_id == w.FUNC_REGISTER_EX
    config, ext, media = w.decode(w.REGISTER_EX_ARGS, w.TC_REGISTER_EX_ARGS, req.body)
    upstream = w.decode(w.SERVICE_CONFIG, w.TC_SERVICE_CONFIG, g.REGISTER_ARGS)
    assert config == upstream and ext == ("tagged", "/adapters/a", 1) and media == ["GPU", "CPU"]
    # index_media alone also needs RegisterEx; the profile fields take their defaults.
    assert c.register(dict(g.REGISTER_CONFIG, index_media=("STORAGE",))) == OK
    assert w.decode(w.REGISTER_EX_ARGS, w.TC_REGISTER_EX_ARGS, srv.requests[-1].body)[1:] == (("", "", 0), ["STORAGE"])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hash_profile": dict(VLLM_PROFILE, lookahead_tokens="1")}, "lookahead_tokens must be an int"),
        ({"hash_profile": dict(VLLM_PROFILE, lookahead_tokens=-1)}, "does not fit"),
        ({"hash_profile": dict(VLLM_PROFILE, extra_keys=1)}, "extra_keys must be a str"),
        ({"hash_profile": dict(VLLM_PROFILE, lookahead=1)}, "unknown hash_profile key"),
        ({"index_media": "GPU"}, "index_media must be a list"),
        ({"index_media": ["GPU", 1]}, r"index_media\[1\] must be a str"),
    ],
)
def test_register_new_fields_validation(recording, change, message):
    _, c = recording
    with pytest.raises(ValueError, match=message):
        c.register(vllm_config("e", "tcp://h:1", **change))


def test_unregister_adapter(recording):
    srv, c = recording
    assert c.unregister("e", lora_name="") == OK
    assert srv.requests[-1].func_id == w.FUNC_UNREGISTER_ADAPTER
    assert w.decode(w.UNREGISTER_ADAPTER_ARGS, w.TC_UNREGISTER_ADAPTER_ARGS, srv.requests[-1].body) == ("e", "default", 0, "")
    assert c.unregister("e") == OK
    assert (srv.requests[-1].func_id, srv.requests[-1].body) == (w.FUNC_UNREGISTER, g.UNREGISTER_ARGS)


def test_new_methods_against_an_upstream_conductor(fake_server):
    """An upstream conductor has none of the new methods: RegisterEx fails as a framework
    error (RPC_FAIL), list_services falls back to ListServices once and stays there."""
    not_registered = Reply(w.encode(w.STR, 0x9DCFFA76, "the function is not registered"), err_code=w.ERRC_FUNCTION_NOT_REGISTERED)

    def handler(req):
        if req.func_id == w.FUNC_LIST_SERVICES:
            return g.LIST_SERVICES_SGLANG
        return not_registered

    srv = fake_server(handler)
    c = ConductorClient()
    assert c.setup(srv.address) == OK
    cfg = dict(g.REGISTER_CONFIG, index_media=["GPU"])
    assert c.register(cfg) == RPC_FAIL
    for _ in range(2):
        listed = c.list_services()
        assert listed["ret"] == OK and listed["count"] == 1 and "HashCheck" not in listed["services"][0]
    calls = [r.func_id for r in srv.requests]
    assert calls.count(w.FUNC_LIST_SERVICE_DETAILS) == 1 and calls.count(w.FUNC_LIST_SERVICES) == 2
    c.close()


def test_multi_lora_against_the_binary(client, publisher_factory):
    """Real binary: a vLLM >= 0.31 engine registered for the base model and an adapter
    (tagged, with its path, offloaded tiers indexed), one subscription; list_services
    shows each adapter with its profile fields, media and self-check, as /services does;
    unregistering the adapter leaves the base model."""
    pub = publisher_factory()
    prof = dict(VLLM_PROFILE, algorithm="sha256", python_hash_seed="unset", extra_keys="tagged")
    base = vllm_config("e", pub.endpoint, hash_profile=prof, index_media=["GPU", "CPU"])
    adapter = dict(base, lora_name="sql", hash_profile=dict(prof, lora_path="/adapters/sql"))
    assert client.register(base) == OK
    assert client.register(adapter) == OK
    assert client.register(dict(base, lora_name="nopath")) == INVALID_PARAMS  # tagged LoRA needs its path
    listed = client.list_services()
    assert listed["ret"] == OK and listed["count"] == 2
    by_lora = {s["LoraName"]: s for s in listed["services"]}
    assert by_lora["sql"]["HashProfile"]["lora_path"] == "/adapters/sql"
    assert by_lora["sql"]["HashProfile"]["extra_keys"] == by_lora[""]["HashProfile"]["extra_keys"] == "tagged"
    assert "lora_path" not in by_lora[""]["HashProfile"] and "lookahead_tokens" not in by_lora[""]["HashProfile"]
    assert by_lora["sql"]["IndexMedia"] == ["GPU", "CPU"] and by_lora["sql"]["HashCheck"] == "unverified"
    assert by_lora[""]["HashProfile"]["root_digest"] != by_lora["sql"]["HashProfile"]["root_digest"]
    assert client.unregister("e", lora_name="sql") == OK
    assert client.unregister("e", lora_name="sql") == SERVICE_NOT_FOUND
    assert [s["LoraName"] for s in client.list_services()["services"]] == [""]
    assert client.unregister("e") == OK
    assert client.list_services()["count"] == 0

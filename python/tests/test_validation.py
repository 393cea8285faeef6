"""Argument validation: the ValueError matrix of register() and the checks of the other calls.

Every rejected call must raise before anything reaches the wire; the fake server records
requests so that is asserted, not assumed.
"""

import copy

import pytest

import goldens as g
from mooncake import _conductor_wire as w
from mooncake.conductor import INVALID_PARAMS, OK, ConductorClient


@pytest.fixture
def recording(served_client):
    """A set-up client whose server answers register INVALID_PARAMS and records requests."""

    def handler(req):
        if req.func_id == w.FUNC_REGISTER:
            return w.encode(w.REGISTER_RESPONSE, w.TC_REGISTER_RESPONSE, (False, INVALID_PARAMS))
        if req.func_id == w.FUNC_QUERY:
            return g.QUERY_RESP_EMPTY
        if req.func_id == w.FUNC_UNREGISTER:
            return g.UNREGISTER_RESP_OK
        raise AssertionError("unexpected function 0x%08x" % req.func_id)

    srv, client = served_client(handler)
    return client, srv


def with_(**changes):
    cfg = copy.deepcopy(g.REGISTER_CONFIG)
    cfg.update(changes)
    return cfg


def with_profile(**changes):
    cfg = copy.deepcopy(g.REGISTER_CONFIG)
    cfg["hash_profile"].update(changes)
    return cfg


REGISTER_VALUE_ERRORS = [
    # config is not a dict
    ("config None", None),
    ("config list", [("model_name", "m")]),
    ("config str", "model_name=m"),
    # keys
    ("non-string key", {**g.REGISTER_CONFIG, 1: "x"}),
    ("bytes key", {**g.REGISTER_CONFIG, b"model_name": "m"}),
    ("unknown key", with_(extra=1)),
    ("HTTP name modelname", with_(modelname="m")),
    ("HTTP name type", with_(type="vLLM")),
    ("root_digest at top level", with_(root_digest="")),
    # string fields with wrong types
    *[("%s not str" % key, with_(**{key: bad})) for key in (
        "instance_id", "endpoint", "replay_endpoint", "model_name", "lora_name", "tenant_id", "publisher_type"
    ) for bad in (None, 1, b"x")],
    ("lone surrogate", with_(model_name="\ud800")),
    # integer fields
    ("block_size str", with_(block_size="16")),
    ("block_size float", with_(block_size=16.0)),
    ("block_size bool", with_(block_size=True)),
    ("block_size None", with_(block_size=None)),
    ("block_size int64 overflow", with_(block_size=1 << 63)),
    ("block_size int64 underflow", with_(block_size=-(1 << 63) - 1)),
    ("dp_rank bool", with_(dp_rank=False)),
    ("dp_rank str", with_(dp_rank="0")),
    ("dp_rank float", with_(dp_rank=0.0)),
    ("dp_rank None", with_(dp_rank=None)),
    ("dp_rank int32 overflow", with_(dp_rank=1 << 31)),
    ("dp_rank int32 underflow", with_(dp_rank=-(1 << 31) - 1)),
    ("cache_group bool", with_(cache_group=True)),
    ("cache_group str", with_(cache_group="0")),
    ("cache_group float", with_(cache_group=0.0)),
    ("cache_group int64 overflow", with_(cache_group=1 << 63)),
    # publisher_type
    ("publisher_type lower case", with_(publisher_type="vllm")),
    ("publisher_type sglang", with_(publisher_type="sglang")),
    ("publisher_type empty", with_(publisher_type="")),
    ("publisher_type unknown", with_(publisher_type="TensorRT")),
    # hash_profile
    ("hash_profile None", with_(hash_profile=None)),
    ("hash_profile str", with_(hash_profile="vllm_v1")),
    ("hash_profile list", with_(hash_profile=[("strategy", "vllm_v1")])),
    ("hash_profile unknown key", with_profile(seed="0")),
    ("hash_profile non-string key", with_(hash_profile={**g.REGISTER_CONFIG["hash_profile"], 1: "x"})),
    ("hash_profile root_digest", with_profile(root_digest=g.ROOT_VLLM_CBOR_SEED0)),
    ("hash_profile empty root_digest", with_profile(root_digest="")),
    *[("hash_profile %s not str" % key, with_profile(**{key: bad})) for key in (
        "strategy", "algorithm", "python_hash_seed", "index_projection"
    ) for bad in (None, 0, b"x")],
]


@pytest.mark.parametrize("name,config", REGISTER_VALUE_ERRORS, ids=[c[0] for c in REGISTER_VALUE_ERRORS])
def test_register_value_errors(recording, name, config):
    client, srv = recording
    with pytest.raises(ValueError):
        client.register(config)
    assert srv.requests == []


def test_register_validates_before_setup():
    # caller mistakes are reported even on an unconnected client
    with pytest.raises(ValueError):
        ConductorClient().register({"bogus": 1})


def _sent_config(srv):
    assert len(srv.requests) == 1
    req = srv.requests[0]
    assert req.func_id == w.FUNC_REGISTER
    return w.decode(w.SERVICE_CONFIG, w.TC_SERVICE_CONFIG, req.body)


def test_register_missing_values_are_sent_empty(recording):
    client, srv = recording
    assert client.register({}) == INVALID_PARAMS
    assert _sent_config(srv) == ("", "", 0, "", "", "default", "", 0, 0, None, ("", "", "", "", ""))


def test_register_defaults_and_normalisation(recording):
    client, srv = recording
    cfg = copy.deepcopy(g.REGISTER_CONFIG)
    del cfg["publisher_type"], cfg["dp_rank"]
    cfg["tenant_id"] = ""
    cfg["cache_group"] = None
    client.register(cfg)
    assert srv.requests[0].body == g.REGISTER_ARGS  # vLLM, tenant "default", dp 0, no group


@pytest.mark.parametrize(
    "changes,index,expected",
    [
        ({"publisher_type": "SGLang"}, 2, 2),
        ({"publisher_type": "Mooncake"}, 2, 1),
        ({"block_size": (1 << 63) - 1}, 7, (1 << 63) - 1),
        ({"block_size": -(1 << 63)}, 7, -(1 << 63)),
        ({"block_size": 0}, 7, 0),
        ({"dp_rank": (1 << 31) - 1}, 8, (1 << 31) - 1),
        ({"dp_rank": -1}, 8, -1),
        ({"cache_group": 0}, 9, 0),
        ({"cache_group": 7}, 9, 7),
        ({"replay_endpoint": "tcp://127.0.0.1:5558"}, 1, "tcp://127.0.0.1:5558"),
        ({"lora_name": "adapter"}, 4, "adapter"),
        ({"tenant_id": "t1"}, 5, "t1"),
    ],
)
def test_register_accepts_in_range_values(recording, changes, index, expected):
    # values the client cannot judge (negative ranks, unsupported groups) go to the server
    client, srv = recording
    assert client.register(with_(**changes)) == INVALID_PARAMS
    assert _sent_config(srv)[index] == expected


def test_register_sglang_profile_without_seed(recording):
    client, srv = recording
    cfg = with_(publisher_type="SGLang", hash_profile={"strategy": "sglang", "algorithm": "sha256_raw", "index_projection": "first64_be"})
    client.register(cfg)
    assert _sent_config(srv)[10] == ("sglang", "sha256_raw", "", "", "first64_be")


QUERY_VALUE_ERRORS = [
    ("token too large", {"token_ids": [1 << 31]}),
    ("token too small", {"token_ids": [-(1 << 31) - 1]}),
    ("token bool", {"token_ids": [1, True]}),
    ("token float", {"token_ids": [1.0]}),
    ("token str", {"token_ids": ["1"]}),
    ("token None", {"token_ids": [None]}),
    ("tokens str", {"token_ids": "123"}),
    ("tokens bytes", {"token_ids": b"\x01\x00\x00\x00"}),
    ("tokens None", {"token_ids": None}),
    ("block_size bool", {"block_size": True}),
    ("block_size float", {"block_size": 16.0}),
    ("block_size overflow", {"block_size": 1 << 63}),
    ("model_name None", {"model_name": None}),
    ("model_name bytes", {"model_name": b"m"}),
    ("lora_name None", {"lora_name": None}),
    ("tenant_id int", {"tenant_id": 0}),
    ("cache_salt None", {"cache_salt": None}),
    ("instance_filter int", {"instance_filter": 1}),
]


@pytest.mark.parametrize("name,changes", QUERY_VALUE_ERRORS, ids=[c[0] for c in QUERY_VALUE_ERRORS])
def test_query_value_errors(recording, name, changes):
    client, srv = recording
    kwargs = {"model_name": "m", "block_size": 16, "token_ids": [1, 2, 3]}
    kwargs.update(changes)
    model = kwargs.pop("model_name")
    with pytest.raises(ValueError):
        client.query(model, **kwargs)
    assert srv.requests == []


def test_query_arguments_are_keyword_only():
    with pytest.raises(TypeError):
        ConductorClient().query("m", 16, [1, 2, 3])


def test_query_token_bounds_and_normalisation_on_the_wire(recording):
    client, srv = recording
    client.query("m", block_size=16, tenant_id="", token_ids=[-(1 << 31), (1 << 31) - 1])
    sent = w.decode(w.QUERY_REQUEST, w.TC_QUERY_REQUEST, srv.requests[0].body)
    assert sent == (("default", "m", "", 16), [-(1 << 31), (1 << 31) - 1], None, None)


@pytest.mark.parametrize(
    "args",
    [(None,), (1,), ("e", None), ("e", "default", True), ("e", "default", 1 << 31), ("e", "default", "0")],
)
def test_unregister_value_errors(recording, args):
    client, srv = recording
    with pytest.raises(ValueError):
        client.unregister(*args)
    assert srv.requests == []


def test_unregister_normalises_empty_tenant(recording):
    client, srv = recording
    assert client.unregister("e", "") == OK
    assert srv.requests[0].body == g.UNREGISTER_ARGS


@pytest.mark.parametrize("kwargs", [{"connect_timeout_ms": True}, {"request_timeout_ms": 1.5}, {"connect_timeout_ms": "1"}])
def test_setup_timeout_types(kwargs):
    with pytest.raises(ValueError):
        ConductorClient().setup("127.0.0.1:1", **kwargs)

"""Python client (mooncake.conductor) query latency against a spawned conductor binary.

    python bench/pyclient/latency.py --bin bin/mooncake_conductor [--sizes 2048,8192,32768]

Starts the binary on free loopback ports, registers --instances vLLM services (no
publisher runs, so they answer with zero counts: the server stops at block 0 and the
figure is the client's encode + round trip + decode), then times --iters queries per
prompt size and prints p50/p99 in microseconds, one JSON line per size. With --hit the
first instance is fed the whole prompt through a ZMQ publisher (needs pyzmq and msgpack)
so that the server hashes and walks every block too.

Each line names the client module timed ("client"), so that an older client can be
timed with the same harness: PYTHONPATH=<checkout>/python python bench/pyclient/latency.py.
--floor also times, on a plain blocking socket with prebuilt frames (no client code),
a ListServices round trip with an empty request body before any registration (the
kernel + loopback + server floor) and, per size, the prebuilt query frame (what is left
when encoding and decoding cost nothing).
"""

import argparse
import json
import os
import random
import socket
import struct
import subprocess
import sys
import tempfile
import time

import mooncake.conductor
from mooncake import _conductor_wire as wire
from mooncake.conductor import OK, ConductorClient

RESP_HEADER = struct.Struct("<BBBBIII")


def raw_round_trips(port, func_id, body, iters):
    """p50/p99 (us) of iters request/reply round trips of one prebuilt frame."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(1 << 20)
    view = memoryview(buf)
    lat = []
    for i in range(iters + 50):
        frame = wire.pack_request_header(i + 1, func_id, len(body)) + body
        t0 = time.perf_counter_ns()
        s.sendall(frame)
        have = 0
        need = 16
        while have < need:
            k = s.recv_into(view[have:])
            if k == 0:
                sys.exit("conductor closed the connection")
            have += k
            if have >= 16:
                _, _, err, _, seq, length, attach = RESP_HEADER.unpack_from(buf)
                need = 16 + length + attach
        if i >= 50:
            lat.append(time.perf_counter_ns() - t0)
        assert err == 0 and seq == i + 1 and have == need
    s.close()
    lat.sort()
    return round(lat[len(lat) // 2] / 1e3, 1), round(lat[int(len(lat) * 0.99)] / 1e3, 1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="bin/mooncake_conductor")
    ap.add_argument("--sizes", default="2048,8192,32768")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--instances", type=int, default=8)
    ap.add_argument("--hit", action="store_true")
    ap.add_argument("--floor", action="store_true", help="also time prebuilt frames on a raw socket")
    args = ap.parse_args()
    rpc, http = free_port(), free_port()
    tmp = tempfile.mkdtemp()
    cfg = os.path.join(tmp, "c.json")
    with open(cfg, "w") as f:
        json.dump({"http_server_port": http, "rpc_server_port": rpc, "state_file": ""}, f)
    log = open(os.path.join(tmp, "log"), "wb")
    proc = subprocess.Popen([args.bin], env=dict(os.environ, CONDUCTOR_CONFIG_PATH=cfg), stdout=log, stderr=log)
    try:
        c = ConductorClient()
        deadline = time.monotonic() + 15
        while c.setup("127.0.0.1:%d" % rpc) != OK:
            if time.monotonic() > deadline:
                sys.exit("conductor did not start")
            time.sleep(0.05)
        client = os.path.dirname(os.path.abspath(mooncake.conductor.__file__))
        if args.floor:
            p50, p99 = raw_round_trips(rpc, wire.FUNC_LIST_SERVICES, b"", args.iters)
            print(json.dumps({"floor": "list_services, empty request body, no services", "iters": args.iters,
                              "p50_us": p50, "p99_us": p99}))
        profile = {"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"}
        pub = None
        for i in range(args.instances):
            ep = "tcp://127.0.0.1:%d" % free_port()
            if i == 0 and args.hit:
                import zmq

                pub = zmq.Context().socket(zmq.XPUB)
                pub.bind(ep)
            assert c.register({"instance_id": "e%d" % i, "endpoint": ep, "model_name": "m", "block_size": 16,
                               "dp_rank": 0, "hash_profile": profile}) == OK
        rng = random.Random(1)
        sizes = [int(s) for s in args.sizes.split(",")]
        prompts = {n: [rng.randrange(0, 150000) for _ in range(n)] for n in sizes}
        if pub is not None:
            import msgpack

            from mooncake._conductor_hash import block_keys

            pub.recv()  # the conductor's subscription
            longest = prompts[max(sizes)]
            for n in sizes:  # every size shares the longest prompt's prefix
                prompts[n] = longest[:n]
            keys = block_keys(longest, profile, 16)
            ev = {"type": "BlockStored", "block_hashes": keys, "parent_block_hash": None, "token_ids": longest,
                  "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None,
                  "extra_keys": [None] * len(keys), "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
            pub.send_multipart([b"", struct.pack(">Q", 0), msgpack.packb([time.time(), [ev], 0])])
            deadline = time.monotonic() + 20
            while True:
                r = c.query("m", block_size=16, token_ids=longest)
                if r["hits"]["e0"]["device"] == len(longest):
                    break
                if time.monotonic() > deadline:
                    log.flush()
                    sys.exit("the prompt never became a hit: %r\n%s" % (r["hits"].get("e0"), open(log.name).read()[-2000:]))
                time.sleep(0.02)
        for n in sizes:
            toks = prompts[n]
            if args.floor:
                body = wire.encode(wire.QUERY_REQUEST, wire.TC_QUERY_REQUEST, (("default", "m", "", 16), toks, None, None))
                p50, p99 = raw_round_trips(rpc, wire.FUNC_QUERY, body, args.iters)
                print(json.dumps({"floor": "prebuilt query frame", "tokens": n, "hit": args.hit, "instances": args.instances,
                                  "iters": args.iters, "p50_us": p50, "p99_us": p99}))
            for _ in range(50):
                c.query("m", block_size=16, token_ids=toks)
            lat = []
            for _ in range(args.iters):
                t0 = time.perf_counter_ns()
                r = c.query("m", block_size=16, token_ids=toks)
                lat.append(time.perf_counter_ns() - t0)
                assert r["ret"] == OK and len(r["hits"]) == args.instances
            lat.sort()
            print(json.dumps({"tokens": n, "hit": args.hit, "instances": args.instances, "iters": args.iters,
                              "p50_us": round(lat[len(lat) // 2] / 1e3, 1), "p99_us": round(lat[int(len(lat) * 0.99)] / 1e3, 1),
                              "client": client}))
        c.close()
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()

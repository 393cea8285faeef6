"""A stand-in for one vLLM engine's KV event publisher, for the README's quick start.

    python python/examples/vllm_publisher.py [--endpoint tcp://127.0.0.1:5557] [--tokens 32]

It announces that the engine holds the prompt 1, 2, ..., N (N = --tokens) in GPU memory:
one BlockStored event for its full blocks of --block-size tokens, with the block hashes
vLLM computes under the hash profile vllm_v1 / sha256_cbor / PYTHONHASHSEED=0 (from
mooncake.conductor.block_keys, the same keys the conductor recomputes from the token ids).
The message is what vLLM's ZMQ publisher sends: three frames (an empty topic, the
sequence number as 8 big-endian bytes, the msgpack batch [timestamp, [event], dp_rank]),
each event a map with "type" first, encoded by msgspec as vLLM does.

A PUB socket drops what it sends before a subscriber has connected, so this one is an
XPUB (a PUB on the wire) that waits for a subscription and then publishes, once per
subscription, with the next sequence number. It runs until interrupted, as an engine does.
Needs pyzmq and msgspec (`make venv` installs both into .venv, with mooncake.conductor).
"""

import argparse
import time

import msgspec
import zmq

from mooncake.conductor import block_keys

#: The hash profile to register the publisher with (conductorctl's --algorithm sha256_cbor --seed 0).
PROFILE = {"strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be"}


def stored_batch(tokens, block_size):
    """The msgpack payload of one KVEventBatch holding a BlockStored for tokens' full blocks."""
    keys = block_keys(tokens, PROFILE, block_size)
    event = {
        "type": "BlockStored",
        "block_hashes": keys,
        "parent_block_hash": None,
        "token_ids": tokens[: len(keys) * block_size],
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }
    return msgspec.msgpack.encode([time.time(), [event], 0]), len(keys)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoint", default="tcp://127.0.0.1:5557", help="address to bind (the registration's endpoint)")
    ap.add_argument("--tokens", type=int, default=32, help="the cached prompt is 1..N")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    args = ap.parse_args()
    tokens = list(range(1, args.tokens + 1))
    payload, blocks = stored_batch(tokens, args.block_size)

    ctx = zmq.Context()
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(args.endpoint)
    print("publishing on %s; waiting for the conductor to subscribe" % args.endpoint, flush=True)
    seq = 0
    try:
        while True:
            if sock.recv()[:1] != b"\x01":  # an unsubscription
                continue
            sock.send_multipart([b"", seq.to_bytes(8, "big"), payload])
            print("sent seq %d: BlockStored, %d blocks (tokens 1..%d)" % (seq, blocks, blocks * args.block_size), flush=True)
            seq += 1
    except KeyboardInterrupt:
        pass
    finally:
        sock.close(0)
        ctx.term()


if __name__ == "__main__":
    main()

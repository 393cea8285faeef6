"""Helpers shared by the engine workers and the orchestrator."""

import enum
import json
import sys
import time

# The prompt every scenario hashes: 40 token ids of mixed magnitudes, so the vectors
# exercise every integer width of pickle (1, 2 and 4 byte forms) and of CBOR / msgpack.
PROMPT = [
    1, 2, 255, 256, 65535, 65536, 151643, 7, 0, 42,
    128000, 300, 17, 99999, 3, 1000, 23, 5, 70000, 11,
    151935, 8, 13, 64, 4096, 31, 2, 600, 77, 100000,
    9, 151642, 12, 127, 128, 32767, 32768, 4, 6, 150000,
]

# Fixed batch timestamp for published events (the engines use time.time()).
BATCH_TS = 1767225600.5


def to_json(value):
    """A JSON view of a Python value built by an engine (tuples, bytes, enums, structs)."""
    if isinstance(value, enum.Enum):
        return to_json(value.value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"bytes_hex": bytes(value).hex()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if hasattr(type(value), "__struct_fields__"):  # a msgspec.Struct
        return {f: to_json(getattr(value, f)) for f in value.__struct_fields__}
    raise TypeError(f"no JSON view for {type(value)!r}")


def msgpack_view(payload):
    """Decode a msgpack payload generically (maps keep key order) for the JSON view."""
    import msgspec

    return to_json(msgspec.msgpack.decode(payload))


def capture_publisher(publisher_cls, zmq, batches, topic, tag, publisher_kwargs):
    """Publish ``batches`` with the engine's own ZMQ publisher and record every frame.

    Runs the engine's ``ZmqEventPublisher`` on inproc endpoints, receives the live
    stream with a SUB socket and then asks the replay ROUTER for everything from
    sequence 1 with a DEALER, recording the frames exactly as received.
    """
    endpoint = f"inproc://kv-events-{tag}"
    replay_endpoint = f"inproc://kv-replay-{tag}"
    pub = publisher_cls(endpoint=endpoint, replay_endpoint=replay_endpoint, topic=topic,
                        **publisher_kwargs)
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.connect(endpoint)
    time.sleep(0.3)  # let the subscription reach the PUB socket before the first batch
    for batch in batches:
        pub.publish(batch)
    live = []
    for _ in batches:
        if not sub.poll(5000):
            raise RuntimeError("publisher sent fewer batches than published")
        live.append(sub.recv_multipart())
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(replay_endpoint)
    dealer.send_multipart([b"", (1).to_bytes(8, "big")])
    replay = []
    while True:
        if not dealer.poll(5000):
            raise RuntimeError("replay ended without its end marker")
        frames = dealer.recv_multipart()
        replay.append(frames)
        if frames[-1] == b"" and frames[-2] == b"\xff" * 8:
            break
    sub.close(linger=0)
    dealer.close(linger=0)
    pub.shutdown()
    return live, replay


def frames_json(frames_list):
    """JSON view of a list of multipart messages (each frame as hex)."""
    return [[f.hex() for f in frames] for frames in frames_list]


def emit(result):
    """Write a worker's result to stdout as JSON."""
    json.dump(result, sys.stdout)
    sys.stdout.flush()


def describe_structs(module, names):
    """Field lists and msgspec options of an engine's event structs (those it defines)."""
    out = {}
    for name in names:
        cls = getattr(module, name, None)
        if cls is None:
            continue
        cfg = cls.__struct_config__
        out[name] = {
            "fields": list(cls.__struct_fields__),
            "defaults_from": len(cls.__struct_fields__) - len(cls.__struct_defaults__),
            "array_like": cfg.array_like,
            "omit_defaults": cfg.omit_defaults,
            "tag": cfg.tag,
            "tag_field": cfg.tag_field,
        }
    return out


def worker_main(load, tasks, stubbed):
    """Read a job from stdin, load the engine with ``load(job)``, run its tasks, print JSON.

    ``load`` returns the positional arguments every task function takes before the task.
    """
    job = json.load(sys.stdin)
    mods = load(job)
    results = {task["id"]: tasks[task["kind"]](*mods, task) for task in job["tasks"]}
    results["__stubbed__"] = sorted(stubbed)
    emit(results)

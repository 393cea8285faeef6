"""Runs one vLLM release's own hashing and event code; reads a job on stdin, writes JSON.

Started by generate.py in a fresh interpreter per job, with PYTHONHASHSEED and
VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES set (or unset) as the job requires, because vLLM
reads both from the environment. Only the modules in REAL are loaded from the wheel;
everything else in the ``vllm`` package is stubbed (see stubs.py).
"""

import inspect
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import stubs  # noqa: E402

REAL = [
    "vllm.envs",
    "vllm.utils.hashing",
    "vllm.utils.math_utils",
    "vllm.utils.gc_utils",
    "vllm.utils.collection_utils",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.block_pool",
    "vllm.v1.token_buffer",
    "vllm.distributed.kv_events",
    "vllm.lora.request",
    "vllm.v1.kv_offload.base",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.events",
    "vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler",
]


class Recorder:
    """Wraps the serializer module a hash function calls, keeping the bytes it hashed."""

    def __init__(self, module, name):
        self._module = module
        self._name = name
        self.last = None

    def __getattr__(self, attr):
        return getattr(self._module, attr)

    def dumps(self, obj, *args, **kwargs):
        data = self._module.dumps(obj, *args, **kwargs)
        self.last = data
        return data


class MMPosition:
    def __init__(self, offset, length):
        self.offset = offset
        self.length = length


class MMFeature:
    def __init__(self, identifier, offset, length):
        self.identifier = identifier
        self.mm_position = MMPosition(offset, length)


class FakeRequest:
    """The attributes of vllm.v1.request.Request that hashing and BlockPool read."""

    def __init__(self, tokens, lora_request=None, cache_salt=None, mm=None):
        self.request_id = "req-0"
        self.prompt_token_ids = list(tokens)
        self.all_token_ids = list(tokens)
        token_buffer = sys.modules.get("vllm.v1.token_buffer")
        if token_buffer is not None and hasattr(token_buffer, "TokenBuffer"):
            self._all_token_ids = token_buffer.TokenBuffer(list(tokens))
        else:
            self._all_token_ids = list(tokens)
        self.num_tokens = len(tokens)
        self.num_prompt_tokens = len(tokens)
        self.block_hashes = []
        self.lora_request = lora_request
        self.cache_salt = cache_salt
        self.mm_features = [MMFeature(*m) for m in (mm or [])]
        self.prompt_embeds = None
        self._prompt_embeds_per_block_hashes = {}
        self.session_id = None


def load(src):
    stubs.install("vllm", src, REAL, provided={"vllm.logger": stubs.logger_module})
    import vllm.utils.hashing as hashing
    import vllm.v1.core.kv_cache_utils as kcu

    hashing.pickle = Recorder(hashing.pickle, "pickle")
    hashing.cbor2 = Recorder(hashing.cbor2, "cbor2")
    return hashing, kcu


def lora_request(spec):
    if spec is None:
        return None
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=spec["name"], lora_int_id=spec["int_id"], lora_path=spec["path"])


def serializer_bytes(hashing, algorithm):
    rec = hashing.cbor2 if algorithm.endswith("cbor") else hashing.pickle
    return rec.last


def task_none_hash(hashing, kcu, task):
    fn = hashing.get_hash_fn_by_name(task["algorithm"])
    hashing.pickle.last = hashing.cbor2.last = None
    kcu.init_none_hash(fn)
    seed_used = getattr(kcu, "_NONE_HASH_SEED", None)
    pre = serializer_bytes(hashing, task["algorithm"])
    return {
        "none_hash_hex": bytes(kcu.NONE_HASH).hex(),
        # The object init_none_hash hashed; None when the release draws os.urandom(32)
        # without hashing anything.
        "seed_text": seed_used if seed_used is not None else (
            os.environ.get("PYTHONHASHSEED")),
        "preimage_hex": pre.hex() if pre is not None else None,
        "none_hash_module_constant": getattr(kcu, "DEFAULT_NONE_HASH_SEED", None),
    }


def hash_request(hashing, kcu, task, request):
    """Run get_request_block_hasher over ``request``, recording every hash_block_tokens call."""
    fn = hashing.get_hash_fn_by_name(task["algorithm"])
    kcu.init_none_hash(fn)
    calls = []
    original = kcu.hash_block_tokens

    def recording(hash_function, parent, tokens, extra_keys=None):
        hashing.pickle.last = hashing.cbor2.last = None
        h = original(hash_function, parent, tokens, extra_keys)
        calls.append({
            "parent": parent,
            "tokens": list(tokens),
            "extra_keys": extra_keys,
            "preimage": serializer_bytes(hashing, task["algorithm"]),
            "hash": h,
        })
        return h

    kcu.hash_block_tokens = recording
    try:
        params = inspect.signature(kcu.get_request_block_hasher).parameters
        lookahead = task.get("lookahead", 0)
        if lookahead:
            if "num_hash_lookahead_tokens" not in params:
                raise RuntimeError("this release has no lookahead hashing")
            hasher = kcu.get_request_block_hasher(task["block_size"], fn, lookahead)
        else:
            hasher = kcu.get_request_block_hasher(task["block_size"], fn)
        hashes = hasher(request)
    finally:
        kcu.hash_block_tokens = original
    assert [c["hash"] for c in calls] == hashes
    request.block_hashes = list(hashes)
    return bytes(kcu.NONE_HASH), calls


def task_hash(hashing, kcu, task):
    request = FakeRequest(task.get("tokens", common.PROMPT), lora_request(task.get("lora")),
                          task.get("cache_salt"), task.get("mm"))
    none_hash, calls = hash_request(hashing, kcu, task, request)
    bs = task["block_size"]
    blocks = []
    for i, c in enumerate(calls):
        blocks.append({
            "index": i,
            "token_range": [i * bs, (i + 1) * bs],
            "extra_keys": common.to_json(c["extra_keys"]),
            "parent_hash_hex": (bytes(c["parent"]) if c["parent"] else none_hash).hex(),
            "preimage_hex": c["preimage"].hex(),
            "hash_hex": bytes(c["hash"]).hex(),
            "event_hash": common.to_json(kcu.maybe_convert_block_hash(c["hash"])),
            "event_extra_keys": common.to_json(event_extra_keys(kcu, c["extra_keys"],
                                                                task.get("lookahead", 0))),
        })
    return {"none_hash_hex": none_hash.hex(), "blocks": blocks}


def event_extra_keys(kcu, extra_keys, lookahead):
    """What BlockPool publishes for a block: the window's keys E (not the lookahead tuple),
    converted back to the untagged form where the release tags them (to_event_extra_keys)."""
    keys = extra_keys[0] if lookahead else extra_keys
    if hasattr(kcu, "to_event_extra_keys"):
        return kcu.to_event_extra_keys([keys])[0]
    return keys


def new_pool(kcu, bp, block_size, lookahead, num_blocks=24):
    params = inspect.signature(bp.BlockPool.__init__).parameters
    kwargs = {}
    if "num_hash_lookahead_tokens" in params:
        kwargs["num_hash_lookahead_tokens"] = lookahead
    elif lookahead:
        raise RuntimeError("this release's BlockPool has no lookahead")
    return bp.BlockPool(num_blocks, True, block_size, enable_kv_cache_events=True, **kwargs)


def task_events(hashing, kcu, task):
    """Store, evict and clear through the engine's BlockPool; publish with its publisher."""
    import zmq

    import vllm.distributed.kv_events as ev
    import vllm.v1.core.block_pool as bp

    bs = task["block_size"]
    lookahead = task.get("lookahead", 0)
    batches = []
    steps = []
    pool = new_pool(kcu, bp, bs, lookahead)
    all_blocks = []
    for req_spec in task["requests"]:
        request = FakeRequest(req_spec.get("tokens", common.PROMPT),
                              lora_request(req_spec.get("lora")), req_spec.get("cache_salt"))
        hash_request(hashing, kcu, {"algorithm": task["algorithm"], "block_size": bs,
                                    "lookahead": lookahead}, request)
        n = len(request.block_hashes)
        blocks = pool.get_new_blocks(n)
        pool.cache_full_blocks(request, blocks, 0, n, bs, 0)
        all_blocks.append(blocks)
        batches.append(ev.KVEventBatch(ts=common.BATCH_TS, events=pool.take_events()))
        steps.append("store " + req_spec["label"])
    # Evict the last cached block of the first request.
    victim = all_blocks[0][-1]
    pool.free_blocks(list(reversed(all_blocks[0])))
    pool.evict_blocks({victim.block_id})
    batches.append(ev.KVEventBatch(ts=common.BATCH_TS, events=pool.take_events()))
    steps.append("evict the first request's last block")
    for blocks in all_blocks[1:]:
        pool.free_blocks(list(reversed(blocks)))
    assert pool.reset_prefix_cache()
    batches.append(ev.KVEventBatch(ts=common.BATCH_TS, events=pool.take_events()))
    steps.append("reset_prefix_cache")
    return publish(ev, zmq, batches, steps, task)


def publish(ev, zmq, batches, steps, task):
    live, replay = common.capture_publisher(
        ev.ZmqEventPublisher, zmq, batches, task.get("topic", ""), task["id"].replace("/", "-"),
        {"data_parallel_rank": 0})
    return {
        "steps": steps,
        "frames": common.frames_json(live),
        "decoded": [common.msgpack_view(f[2]) for f in live],
        "replay_request": ["", (1).to_bytes(8, "big").hex()],
        "replay_frames": common.frames_json(replay),
    }


def task_media(hashing, kcu, task):
    """Offloading-connector events (CPU / STORAGE media) from the release's own code."""
    import zmq

    import vllm.distributed.kv_events as ev

    bs = task["block_size"]
    request = FakeRequest(common.PROMPT)
    hash_request(hashing, kcu, {"algorithm": task["algorithm"], "block_size": bs}, request)
    import vllm.v1.kv_offload.base as base

    group_idx = 0
    keys = [base.make_offload_key(bytes(h), group_idx) for h in request.block_hashes]
    media = task.get("media") or release_media(base, ev)
    events = []
    try:
        import vllm.distributed.kv_transfer.kv_connector.v1.offloading.events as oev
    except ImportError:
        oev = None
    for medium in media:
        raw = [base.OffloadingEvent(keys=keys, medium=_medium(base, medium), removed=False),
               base.OffloadingEvent(keys=keys[-1:], medium=_medium(base, medium), removed=True)]
        if oev is not None and hasattr(oev, "OffloadingEventsTracker"):
            config = types.SimpleNamespace(enable_kv_cache_events=True,
                                           self_describing_kv_events=False)
            tracker = oev.OffloadingEventsTracker(config)
            events.extend(tracker.take_events(raw))
            source = "OffloadingEventsTracker.take_events (placeholder payloads)"
        else:
            import vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler as osch

            cls = next(c for c in vars(osch).values() if isinstance(c, type)
                       and "take_events" in vars(c) and c.__module__ == osch.__name__)
            fake_self = types.SimpleNamespace(manager=types.SimpleNamespace(take_events=lambda r=raw: iter(r)))
            events.extend(cls.take_events(fake_self))
            source = f"{cls.__name__}.take_events"
    batches = [ev.KVEventBatch(ts=common.BATCH_TS, events=events)]
    out = publish(ev, zmq, batches, [f"offload store+evict on {', '.join(media)}"], task)
    out["source"] = source
    out["block_hashes_hex"] = [bytes(h).hex() for h in request.block_hashes]
    return out


def release_media(base, ev):
    """The offloading media this release can publish: its Medium enum, else its MEDIUM_*
    constants, else the CPU spec's medium() string (``"CPU"``)."""
    enum_cls = getattr(base, "Medium", None)
    if enum_cls is not None:
        return [m.name for m in enum_cls]
    consts = [v for k, v in vars(ev).items() if k.startswith("MEDIUM_") and v != "GPU"]
    return consts or ["CPU"]


def _medium(base, medium):
    enum_cls = getattr(base, "Medium", None)
    if enum_cls is not None:
        return enum_cls[medium]
    return medium


def task_struct_fields(hashing, kcu, task):
    """Field lists and msgspec options of the release's event structs."""
    import msgspec

    import vllm.distributed.kv_events as ev

    out = common.describe_structs(ev, ("EventBatch", "BlockStored", "BlockRemoved",
                                       "AllBlocksCleared"))
    out["media_constants"] = {k: v for k, v in vars(ev).items() if k.startswith("MEDIUM_")}
    out["msgspec_version"] = msgspec.__version__
    return out


TASKS = {
    "none_hash": task_none_hash,
    "hash": task_hash,
    "events": task_events,
    "media": task_media,
    "struct_fields": task_struct_fields,
}


def main():
    common.worker_main(lambda job: load(job["src"]), TASKS, stubs.STUBBED)


if __name__ == "__main__":
    main()

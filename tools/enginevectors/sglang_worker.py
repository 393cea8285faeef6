"""Runs one SGLang release's own page hashing and KV-event code; job on stdin, JSON out.

SGLang hashes pages in a C++ extension (``mem_cache/cpp_utils/hash_binding.cpp``) that it
compiles at run time through torch's extension loader. Here the same source, taken from
the wheel, is compiled with g++ and the same flags (pybind11 headers, -lcrypto) and handed
to the engine's ``native_hash`` module in place of the torch loader. The radix-tree
``RadixKey`` / ``TreeNode`` classes, ``KVCacheEventRecorder`` and the ZMQ publisher are
the release's own; only unrelated modules are stubbed (see stubs.py).
"""

import hashlib
import importlib.util
import os
import subprocess
import sys
import sysconfig
from array import array

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import stubs  # noqa: E402

REAL = [
    "sglang.srt.disaggregation.kv_events",
    "sglang.srt.mem_cache.events",
    "sglang.srt.mem_cache.utils",
    "sglang.srt.mem_cache.cpp_utils.native_hash",
    "sglang.srt.mem_cache.radix_cache",
    "sglang.srt.lora.lora_registry",
]


def extension_loader(build_dir, function_name):
    """A module whose ``function_name`` builds a CPU extension with g++ (torch's loader
    ``torch.utils.cpp_extension.load`` in SGLang <= 0.5.20, SGLang's own
    ``load_extension_with_recovery`` after), with the flags SGLang passes."""

    def factory(module):
        def load_extension(name, sources, extra_cflags=None, extra_cuda_cflags=None,
                           extra_ldflags=None, with_cuda=None, verbose=False, **_):
            import pybind11

            os.makedirs(build_dir, exist_ok=True)
            suffix = sysconfig.get_config_var("EXT_SUFFIX")
            target = os.path.join(build_dir, name + suffix)
            if not os.path.exists(target):
                cmd = (["g++", "-shared", "-fPIC", f"-DTORCH_EXTENSION_NAME={name}",
                        "-I" + sysconfig.get_paths()["include"], "-I" + pybind11.get_include()]
                       + list(extra_cflags or []) + list(sources) + list(extra_ldflags or [])
                       + ["-o", target + ".tmp"])
                subprocess.run(cmd, check=True)
                os.rename(target + ".tmp", target)
            spec = importlib.util.spec_from_file_location(name, target)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return mod

        setattr(module, function_name, load_extension)

    return factory


def load(src, build_dir):
    stubs.install("sglang", src, REAL, provided={
        "sglang.srt.utils.cpp_extension_loader": extension_loader(
            build_dir, "load_extension_with_recovery"),
        "torch.utils.cpp_extension": extension_loader(build_dir, "load"),
    })
    import sglang.srt.disaggregation.kv_events as kv
    import sglang.srt.mem_cache.events as events
    import sglang.srt.mem_cache.radix_cache as rc
    import sglang.srt.mem_cache.utils as mu

    return kv, events, rc, mu


def make_tree(rc, tokens, split, extra_key, cache_salt, bigram):
    """Root -> node A (tokens[:split]) -> node B (tokens[split:]), as a radix insert leaves them.

    With bigram keys the nodes hold bigram units; node keys are RadixKey slices of the
    request's key, so node B's raw tokens start at its first bigram's first token.
    """
    key = rc.RadixKey(array("q", tokens), extra_key, is_bigram=bigram, cache_salt=cache_salt) \
        if _has_cache_salt(rc) else rc.RadixKey(array("q", tokens), extra_key, is_bigram=bigram)
    root = rc.TreeNode()
    root.key = rc.RadixKey(array("q"), None)
    root.hash_value = []
    nodes = []
    parent = root
    for part in (key[:split], key[split:]):
        node = rc.TreeNode()
        node.key = part
        node.parent = parent
        parent.children[0] = node
        nodes.append(node)
        parent = node
    return root, nodes


def _has_cache_salt(rc):
    import inspect

    return "cache_salt" in inspect.signature(rc.RadixKey.__init__).parameters


def new_recorder(events, page_size, dynamo_format, lora_names):
    import inspect

    params = inspect.signature(events.KVCacheEventRecorder.__init__).parameters
    kwargs = {}
    if "dynamo_format" in params:
        kwargs["dynamo_format"] = dynamo_format
    elif dynamo_format:
        raise RuntimeError("this release has no dynamo event format")
    if "lora_names" in params:
        kwargs["lora_names"] = lora_names
    return events.KVCacheEventRecorder(enabled=True, page_size=page_size, **kwargs)


def lora_table(events, lora, registered):
    """The release's LoRA name table with the request's adapter registered as the engine does."""
    cls = getattr(events, "KvEventLoraNames", None) or getattr(events, "LoRANameTable", None)
    if cls is None:
        return None
    table = cls()
    if lora is not None and registered:
        import types

        if cls.__name__ == "KvEventLoraNames":
            # Scheduler: registered at start-up for --lora-paths adapters, and per request
            # on admission (keyed by the request's final extra_key).
            table.register(lora_id=lora["lora_id"], lora_name=lora["name"])
            table.register(types.SimpleNamespace(extra_key=lora["extra_key"],
                                                 lora_id=lora["lora_id"]), lora["name"])
        else:
            table.register(lora_id=lora["lora_id"], lora_name=lora["name"])
    return table


def resolve_lora(lora):
    """Fill in the adapter's lora_id and the request's extra_key as the engine forms them.

    ``lora_id`` given: an adapter loaded at run time (/load_lora_adapter mints a uuid4).
    Otherwise: an adapter from --lora-paths, whose id is LoRARef.deterministic_id(name,
    path). Req appends the id to the caller's extra_key (``(extra_key or "") + lora_id``).
    """
    if lora is None:
        return None
    lora = dict(lora)
    if lora.get("lora_id") is None:
        import sglang.srt.lora.lora_registry as reg

        lora["lora_id"] = reg.LoRARef.deterministic_id(lora["name"], lora["path"])
    lora["extra_key"] = (lora.get("user_extra_key") or "") + lora["lora_id"]
    return lora


def task_lora_id(kv, events, rc, mu, task):
    """LoRARef.deterministic_id, the id --lora-paths adapters get (0.5.23)."""
    import sglang.srt.lora.lora_registry as reg

    if not hasattr(reg.LoRARef, "deterministic_id"):
        return {"deterministic_id": None}
    return {"deterministic_id": reg.LoRARef.deterministic_id(task["name"], task["path"])}


def aligned(tokens, ps, bigram):
    """The prompt cut to whole pages, as radix inserts are (page_align_keys), and the
    number of units (tokens, or bigrams) node A holds."""
    n_units = ((len(tokens) - 1 if bigram else len(tokens)) // ps) * ps
    tokens = tokens[:n_units + 1] if bigram else tokens[:n_units]
    return tokens, (n_units // ps // 2) * ps or ps


def task_pages(kv, events, rc, mu, task):
    """Page hashes of both chains (tree / storage chain and KV-event chain) plus the events."""
    ps = task["page_size"]
    bigram = task.get("bigram", False)
    tokens, split = aligned(task.get("tokens", common.PROMPT), ps, bigram)
    lora = resolve_lora(task.get("lora"))
    extra_key = lora["extra_key"] if lora else None
    salt = task.get("cache_salt")
    root, nodes = make_tree(rc, tokens, split, extra_key, salt, bigram)
    table = lora_table(events, lora, task.get("registered", True))
    rec = new_recorder(events, ps, task.get("dynamo_format", False), table)
    for node in nodes:
        rec.record_store(node)
    stored = rec.take()
    rec.record_remove(nodes[-1])
    rec.record_all_cleared() if hasattr(rec, "record_all_cleared") else rec.enqueue(kv.AllBlocksCleared())
    later = rec.take()
    pages = []
    seed = None
    for node in nodes:
        tree_hashes = node.hash_value
        event_hashes = node.event_hash_value if node.event_hash_value is not None else tree_hashes
        key = node.key
        raw = list(key.token_ids)
        for p, h in enumerate(tree_hashes):
            start = p * ps
            end = min(start + ps, len(key))
            units = ([[raw[j], raw[j + 1]] for j in range(start, end)] if bigram
                     else raw[start:end])
            pages.append({
                "units": units,
                "partial": end - start < ps,
                "tree_hash_hex": h,
                "event_chain_hash_hex": event_hashes[p],
            })
    # Attach the published value of each page from the recorded events.
    published = [h for ev in stored for h in ev.block_hashes]
    assert len(published) == len(pages), (len(published), len(pages))
    for page, value in zip(pages, published):
        page["event_i64"] = value
    if salt is not None:
        seed = hashlib.sha256(b"sglang-cache-salt-v1\0" + salt.encode()).hexdigest()
    return {
        "tokens": tokens,
        "lora": lora,
        "split_units": split,
        "pages": pages,
        "event_chain_seed_hex": seed,
        "stored_events": [common.to_json(_struct_dict(e)) for e in stored],
        "later_events": [common.to_json(_struct_dict(e)) for e in later],
        "_batches": (stored, later),
    }


def _struct_dict(struct):
    out = {"type": getattr(type(struct), "__struct_config__").tag}
    for f in struct.__struct_fields__:
        out[f] = getattr(struct, f)
    return out


def task_events(kv, events, rc, mu, task):
    import zmq

    result = task_pages(kv, events, rc, mu, task)
    stored, later = result.pop("_batches")
    batches = [kv.KVEventBatch(ts=common.BATCH_TS, events=stored),
               kv.KVEventBatch(ts=common.BATCH_TS, events=later)]
    media = task.get("media")
    if media:
        # Re-record the same nodes on lower tiers, as HiCache does on write-back / eviction.
        ps = task["page_size"]
        tokens, split = aligned(task.get("tokens", common.PROMPT), ps, False)
        root, nodes = make_tree(rc, tokens, split, None, None, False)
        rec = new_recorder(events, ps, False, lora_table(events, None, False))
        for m in media:
            medium = kv.StorageMedium[m]
            for node in nodes:
                rec.record_store(node, medium=medium)
            rec.record_remove(nodes[-1], medium=medium)
        batches.append(kv.KVEventBatch(ts=common.BATCH_TS, events=rec.take()))
    live, replay = common.capture_publisher(
        kv.ZmqEventPublisher, zmq, batches, task.get("topic", ""), task["id"].replace("/", "-"),
        {"attn_dp_rank": 0})
    result.update({
        "frames": common.frames_json(live),
        "decoded": [common.msgpack_view(f[2]) for f in live],
        "replay_request": ["", (1).to_bytes(8, "big").hex()],
        "replay_frames": common.frames_json(replay),
    })
    return result


def task_struct_fields(kv, events, rc, mu, task):
    """Field lists and msgspec options of the release's event structs."""
    import msgspec

    out = common.describe_structs(kv, ("EventBatch", "BlockStored", "BlockStoredWithMetadata",
                                       "BlockStoredMetadata", "BlockRemoved", "AllBlocksCleared"))
    out["storage_media"] = {m.name: m.value for m in kv.StorageMedium}
    out["msgspec_version"] = msgspec.__version__
    return out


def task_pages_only(kv, events, rc, mu, task):
    result = task_pages(kv, events, rc, mu, task)
    result.pop("_batches")
    return result


TASKS = {
    "pages": task_pages_only,
    "events": task_events,
    "lora_id": task_lora_id,
    "struct_fields": task_struct_fields,
}


def main():
    common.worker_main(lambda job: load(job["src"], job["build_dir"]), TASKS, stubs.STUBBED)


if __name__ == "__main__":
    main()

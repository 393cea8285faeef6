"""Engine-side KV-event publishers for end-to-end tests, shaped like the real ones.

The msgspec structs mirror vLLM's ``vllm/distributed/kv_events.py`` (after PR #42892:
tagged-union events encoded as maps with defaults omitted, the batch an array) and
SGLang's ``srt/disaggregation/kv_events.py`` (tagged maps since PR #37482; the legacy
array-like form is kept to check against the shared vectors). ``ZmqPublisher`` sends the
same three-frame messages as their ``ZmqEventPublisher``:
``[topic, seq (u64 big-endian), payload]``.
"""

import time
from typing import Any, List, Optional, Union

import msgspec
import zmq


# ---- vLLM (current: map events, omit_defaults) ----------------------------------------


class VllmEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: List[Any]
    data_parallel_rank: Optional[int] = None


class VllmKVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of vLLM's tagged union: the tag field is "type", the tag value the class name."""


class BlockStored(VllmKVCacheEvent):
    block_hashes: List[int]
    parent_block_hash: Optional[int]
    token_ids: List[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str]
    lora_name: Optional[str]
    extra_keys: Optional[List[Optional[tuple]]] = None
    group_idx: Optional[int] = None
    kv_cache_spec_kind: Optional[str] = None
    kv_cache_spec_sliding_window: Optional[int] = None


class BlockRemoved(VllmKVCacheEvent):
    block_hashes: List[int]
    medium: Optional[str]
    group_idx: Optional[int] = None


class AllBlocksCleared(VllmKVCacheEvent):
    pass


class VllmKVEventBatch(VllmEventBatch):
    events: List[Union[BlockStored, BlockRemoved, AllBlocksCleared]]


# ---- SGLang (current: tagged map events) -----------------------------------------------


class SglEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: List[Any]
    attn_dp_rank: Optional[int] = None


class SglKVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of SGLang's tagged union (same tag rule as vLLM)."""


class SglBlockStoredFields(msgspec.Struct, omit_defaults=True, gc=False):
    """SGLang's first BlockStored fields, in order: the legacy array-like event has these,
    and the tagged-map one appends to them (its encoding sets map or array, and the tag)."""

    block_hashes: List[int]
    parent_block_hash: Optional[int]
    token_ids: List[int]
    block_size: int
    lora_id: Optional[int]
    medium: Optional[str] = None


class SglBlockStored(SglBlockStoredFields, SglKVCacheEvent, tag="BlockStored"):
    cache_salt: Optional[str] = None
    session_id: Optional[str] = None


class SglBlockRemoved(SglKVCacheEvent, tag="BlockRemoved"):
    block_hashes: List[int]
    medium: Optional[str] = None


class SglAllBlocksCleared(SglKVCacheEvent, tag="AllBlocksCleared"):
    pass


class SglKVEventBatch(SglEventBatch):
    events: List[Union[SglBlockStored, SglBlockRemoved, SglAllBlocksCleared]]


# ---- SGLang legacy (array-like events), only to check struct shapes against vectors -----


class SglLegacyEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Pre-#37482 SGLang events: positional arrays, the tag first."""


class SglLegacyBlockStored(SglBlockStoredFields, SglLegacyEvent, tag="BlockStored"):
    pass


class SglLegacyKVEventBatch(SglEventBatch):
    events: List[SglLegacyBlockStored]


ENCODER = msgspec.msgpack.Encoder()


def encode(batch):
    """The payload frame, exactly as the engines produce it."""
    return ENCODER.encode(batch)


class ZmqPublisher:
    """An engine's KV-event PUB endpoint on a free 127.0.0.1 port.

    It is an XPUB socket so a test can wait for the conductor's subscription before it
    publishes (a PUB drops what it sends before a subscriber is connected); on the wire it
    is a PUB. Sequence numbers start at 0 and grow by one per batch, as in vLLM.
    """

    def __init__(self, topic=b""):
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = "tcp://127.0.0.1:%d" % port
        self.topic = topic
        self.seq = 0

    def wait_subscribed(self, timeout=10.0):
        """Block until a subscription message arrives from the conductor's SUB socket."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.sock.poll(50):
                msg = self.sock.recv()
                if msg[:1] == b"\x01":
                    return
        raise TimeoutError("no subscriber connected to %s" % self.endpoint)

    def publish(self, batch):
        """Send one batch (a struct or an already encoded payload); returns its seq."""
        payload = batch if isinstance(batch, (bytes, bytearray)) else encode(batch)
        seq = self.seq
        self.sock.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        self.seq += 1
        return seq

    def close(self):
        self.sock.close(0)
        self.ctx.term()

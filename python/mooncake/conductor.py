"""Pure-Python client for the Conductor RPC service (``mooncake.conductor``).

A drop-in for the upstream pybind-based ``mooncake.conductor`` module: same class,
methods, return shapes and error codes, but it speaks the coro_rpc/struct_pack wire
itself, so no native extension is needed.

Errors are reported the way the upstream client reports them: integer codes from
lifecycle and mutating calls, a ``ret`` field in read results. Exceptions are raised
only for caller mistakes (bad argument types or values), as ``ValueError``.
"""

import socket
import threading
import time

from mooncake import _conductor_wire as _wire
from mooncake._conductor_hash import block_keys

__all__ = [
    "ConductorClient",
    "block_keys",
    "OK",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "RPC_FAIL",
    "RPC_TIMEOUT",
    "CONDUCTOR_UNAVAILABLE",
    "SERVICE_NOT_FOUND",
    "HEALTH_OK",
    "HEALTH_NOT_INITIALIZED",
    "HEALTH_UNREACHABLE",
]

#: Success.
OK = 0
#: Internal service failure.
INTERNAL_ERROR = -1
#: Invalid address or request/configuration values.
INVALID_PARAMS = -600
#: RPC connection or transport failure.
RPC_FAIL = -900
#: RPC request timed out.
RPC_TIMEOUT = -901
#: Client is not connected, or the service is unavailable.
CONDUCTOR_UNAVAILABLE = -2000
#: Subscription to unregister was not found.
SERVICE_NOT_FOUND = -2001

#: health_check(): the probe succeeded.
HEALTH_OK = 0
#: health_check(): setup() has not succeeded (or close() was called).
HEALTH_NOT_INITIALIZED = 1
#: health_check(): the client is set up but the probe failed.
HEALTH_UNREACHABLE = 2

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1

# A response body larger than this is treated as a corrupt stream rather than
# allocated: the largest legitimate reply (a global view of many contexts) is far smaller.
_MAX_RESPONSE_BYTES = 1 << 30
_RECV_BUFFER_BYTES = 1 << 16
# Encoded query fields (model, LoRA, block size, tenant, salt, filter) kept per client.
_QUERY_TEMPLATES = 64

_REGISTER_STR_KEYS = (
    "instance_id",
    "endpoint",
    "replay_endpoint",
    "publisher_type",
    "model_name",
    "lora_name",
    "tenant_id",
)
_REGISTER_KEYS = frozenset(_REGISTER_STR_KEYS + ("block_size", "dp_rank", "cache_group", "hash_profile", "index_media"))
_PROFILE_KEYS = ("strategy", "algorithm", "python_hash_seed", "index_projection")
# The optional hash_profile fields of issue 25 (this conductor's RegisterEx carries them).
_PROFILE_EXT_STR_KEYS = ("extra_keys", "lora_path")
_PROFILE_EXT_KEYS = _PROFILE_EXT_STR_KEYS + ("lookahead_tokens",)


def _check_str(name, value):
    if not isinstance(value, str):
        raise ValueError("%s must be a str, got %s" % (name, type(value).__name__))
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("%s is not encodable as UTF-8" % name) from None
    return value


def _check_int(name, value, lo, hi):
    # bool is an int subclass in Python, but True is never a meaningful block size or rank.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("%s must be an int, got %s" % (name, type(value).__name__))
    if value < lo or value > hi:
        raise ValueError("%s=%d does not fit in %d bits" % (name, value, 32 if hi == _INT32_MAX else 64))
    return value


def _tenant(value):
    return value if value else "default"


def _split_address(addr):
    """Split "host:port" at the last ':'; returns (host, port) or None when malformed."""
    if not isinstance(addr, str):
        return None
    idx = addr.rfind(":")
    if idx < 0:
        return None
    host, port = addr[:idx], addr[idx + 1 :]
    if len(host) >= 2 and host[0] == "[" and host[-1] == "]":
        host = host[1:-1]
    if not host or not port.isdigit() or not port.isascii():
        return None
    port_num = int(port)
    if port_num > 65535:
        return None
    return host, port_num


class _CallFailed(Exception):
    """Internal: carries the error code of a call that did not produce a decodable reply
    (and, for a framework error, the server's coro_rpc error code)."""

    def __init__(self, code, framework=0):
        super().__init__(code)
        self.code = code
        self.framework = framework


class ConductorClient:
    """Client for the Conductor RPC service.

    One TCP connection, guarded by one lock, so a client may be shared between
    threads; calls are serialised on the connection as in the upstream C++ client.
    Usable as a context manager: ``__exit__`` calls close(), even on exceptions.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._sock = None
        self._target = None  # (host, port) of the last successful setup(); None = uninitialised
        self._connect_timeout = 1.0
        self._request_timeout = 3.0
        self._seq = 0
        # Replies are read with one recv into this buffer when they fit (a query's does):
        # header and body in one system call. Bytes past the reply (none from a
        # conforming server) stay for the next call, as they would in the socket.
        self._rbuf = bytearray(_RECV_BUFFER_BYTES)
        self._rhave = 0
        self._templates = {}
        # True once the server answered ListServiceDetails "function not registered"
        # (an upstream conductor): list_services() then asks ListServices only.
        self._upstream_views = False

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    # -- lifecycle ---------------------------------------------------------

    def setup(self, conductor_addr, connect_timeout_ms=1000, request_timeout_ms=3000):
        """Connect to ``host:port`` (IPv6 as ``[addr]:port``); returns OK or an error code.

        Any previous connection is dropped first, so a failed attempt leaves the
        client uninitialised (INVALID_PARAMS for a malformed address or non-positive
        timeout, RPC_FAIL when the connection cannot be made).
        """
        _check_int("connect_timeout_ms", connect_timeout_ms, _INT64_MIN, _INT64_MAX)
        _check_int("request_timeout_ms", request_timeout_ms, _INT64_MIN, _INT64_MAX)
        with self._lock:
            self._drop()
            self._target = None
            target = _split_address(conductor_addr)
            if target is None or connect_timeout_ms <= 0 or request_timeout_ms <= 0:
                return INVALID_PARAMS
            connect_timeout = connect_timeout_ms / 1000.0
            try:
                self._sock = self._connect(target, connect_timeout)
            except OSError:
                return RPC_FAIL
            self._target = target
            self._upstream_views = False
            self._connect_timeout = connect_timeout
            self._request_timeout = request_timeout_ms / 1000.0
            return OK

    def close(self):
        """Release the connection; safe to repeat. Does not unregister anything. Returns OK."""
        with self._lock:
            self._drop()
            self._target = None
        return OK

    def health_check(self):
        """HEALTH_OK if ListServices succeeds, HEALTH_NOT_INITIALIZED before setup or after
        close, HEALTH_UNREACHABLE if the set-up client's probe fails."""
        try:
            self._call(_wire.FUNC_LIST_SERVICES, b"", _wire.SERVICE_LIST, _wire.TC_SERVICE_LIST)
        except _CallFailed as failed:
            if failed.code == CONDUCTOR_UNAVAILABLE:
                return HEALTH_NOT_INITIALIZED
            return HEALTH_UNREACHABLE
        return HEALTH_OK

    # -- requests ----------------------------------------------------------

    def query(
        self,
        model_name,
        *,
        lora_name="",
        block_size,
        tenant_id="default",
        token_ids,
        cache_salt="",
        instance_filter="",
    ):
        """Prefix-cache hits for a prompt: ``{"ret": int, "hits": {instance_id: fields}}``.

        Raises ValueError for wrongly typed arguments or token ids outside int32.
        Empty cache_salt/instance_filter are sent as absent, as upstream does.
        """
        key = (model_name, lora_name, block_size, tenant_id, cache_salt, instance_filter)
        # Exact types only: 16.0 or True would find the entry of block_size 16.
        exact = (type(model_name) is str and type(lora_name) is str and type(block_size) is int
                 and type(tenant_id) is str and type(cache_salt) is str and type(instance_filter) is str)
        template = self._templates.get(key) if exact else None
        if template is None:
            _check_str("model_name", model_name)
            _check_str("lora_name", lora_name)
            _check_int("block_size", block_size, _INT64_MIN, _INT64_MAX)
            _check_str("tenant_id", tenant_id)
            _check_str("cache_salt", cache_salt)
            _check_str("instance_filter", instance_filter)
            template = _wire.QueryTemplate(
                _tenant(tenant_id), model_name, lora_name, block_size, cache_salt or None, instance_filter or None
            )
            if exact:
                if len(self._templates) >= _QUERY_TEMPLATES:
                    self._templates.clear()
                self._templates[key] = template
        try:
            body = template.parts(token_ids)
        except _wire.WireError as exc:
            raise ValueError("token_ids: %s" % exc) from None
        try:
            ok, value = self._call(_wire.FUNC_QUERY, body, decoder=_wire.decode_query_response)
        except _CallFailed as failed:
            return {"ret": failed.code, "hits": {}}
        if not ok:
            return {"ret": value, "hits": {}}
        return {"ret": OK, "hits": value}

    def register(self, config):
        """Register one publisher subscription described by a dict; returns OK or an error code.

        Raises ValueError for a non-dict config, unknown or non-string keys, wrong value
        types, integer overflow, an unknown publisher_type, or a bad hash_profile (including
        a root_digest, which the server derives). Missing required values are sent empty
        and rejected by the server with INVALID_PARAMS.

        A config using the hash_profile fields ``extra_keys``, ``lora_path`` or
        ``lookahead_tokens``, or ``index_media``, is sent with this conductor's RegisterEx
        (an upstream conductor does not have it: RPC_FAIL); any other with Register,
        byte for byte as before. Registering another ``lora_name`` of a registered engine
        adds that adapter (multi-LoRA).
        """
        args, ext, media = _service_config(config)
        if ext is None and media is None:
            body = _wire.encode(_wire.SERVICE_CONFIG, _wire.TC_SERVICE_CONFIG, args)
            func = _wire.FUNC_REGISTER
        else:
            body = _wire.encode(_wire.REGISTER_EX_ARGS, _wire.TC_REGISTER_EX_ARGS, (args, ext or ("", "", 0), media))
            func = _wire.FUNC_REGISTER_EX
        return self._call_code(func, body, _wire.REGISTER_RESPONSE, _wire.TC_REGISTER_RESPONSE)

    def unregister(self, instance_id, tenant_id="default", dp_rank=0, lora_name=None):
        """Stop the subscription (instance_id, tenant_id, dp_rank); OK, SERVICE_NOT_FOUND or another code.

        With ``lora_name`` (``""`` being the base model's), only that adapter of a
        multi-LoRA registration goes (this conductor's UnregisterAdapter); the last
        adapter's unregistration stops the subscription.
        """
        _check_str("instance_id", instance_id)
        _check_str("tenant_id", tenant_id)
        _check_int("dp_rank", dp_rank, _INT32_MIN, _INT32_MAX)
        if lora_name is None:
            body = _wire.encode(_wire.UNREGISTER_ARGS, _wire.TC_UNREGISTER_ARGS, (instance_id, _tenant(tenant_id), dp_rank))
            func = _wire.FUNC_UNREGISTER
        else:
            _check_str("lora_name", lora_name)
            body = _wire.encode(
                _wire.UNREGISTER_ADAPTER_ARGS,
                _wire.TC_UNREGISTER_ADAPTER_ARGS,
                (instance_id, _tenant(tenant_id), dp_rank, lora_name),
            )
            func = _wire.FUNC_UNREGISTER_ADAPTER
        return self._call_code(func, body, _wire.UNREGISTER_RESPONSE, _wire.TC_UNREGISTER_RESPONSE)

    def get_global_view(self):
        """Snapshot of indexed contexts: ``{"ret", "context_count", "contexts"}``."""
        try:
            count, views = self._call(_wire.FUNC_GET_GLOBAL_VIEW, b"", _wire.GLOBAL_VIEW, _wire.TC_GLOBAL_VIEW)
        except _CallFailed as failed:
            return {"ret": failed.code, "context_count": 0, "contexts": []}
        contexts = []
        for (tenant_id, model_name, lora_name, block_size), profile, ranks, prefix_count in views:
            contexts.append(
                {
                    "model_name": model_name,
                    "lora_name": lora_name,
                    "block_size": block_size,
                    "tenant_id": tenant_id,
                    "prefix_count": prefix_count,
                    "hash_profile": _profile_dict(profile),
                    "instances": {inst: set(r) for inst, r in ranks.items()},
                }
            )
        return {"ret": OK, "context_count": count, "contexts": contexts}

    def list_services(self):
        """Active publisher configurations: ``{"ret", "count", "services"}`` with export keys.

        From this conductor (its ListServiceDetails), each entry also has ``IndexMedia``
        (the event media indexed) and ``HashCheck`` (the profile self-check: ``"ok"``,
        ``"unverified"``, ``"mismatch (<suggestion>)"`` or ``"off"``), and its
        ``HashProfile`` the fields of issue 25 where set, as ``GET /services`` shows
        them; one entry per adapter of a multi-LoRA registration. From an upstream
        conductor, the upstream keys only.
        """
        if not self._upstream_views:
            try:
                details = self._call(
                    _wire.FUNC_LIST_SERVICE_DETAILS, b"", _wire.SERVICE_DETAIL_LIST, _wire.TC_SERVICE_DETAIL_LIST
                )
            except _CallFailed as failed:
                if failed.framework != _wire.ERRC_FUNCTION_NOT_REGISTERED:
                    return {"ret": failed.code, "count": 0, "services": []}
                self._upstream_views = True  # until the next setup()
            else:
                services = []
                for cfg, ext, media, check in details:
                    svc = _service_dict(cfg)
                    svc["HashProfile"].update(_profile_ext_dict(ext))
                    svc["IndexMedia"] = media
                    svc["HashCheck"] = check
                    services.append(svc)
                return {"ret": OK, "count": len(services), "services": services}
        try:
            configs = self._call(_wire.FUNC_LIST_SERVICES, b"", _wire.SERVICE_LIST, _wire.TC_SERVICE_LIST)
        except _CallFailed as failed:
            return {"ret": failed.code, "count": 0, "services": []}
        services = [_service_dict(cfg) for cfg in configs]
        return {"ret": OK, "count": len(services), "services": services}

    # -- transport ---------------------------------------------------------

    @staticmethod
    def _connect(target, timeout):
        sock = socket.create_connection(target, timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        return sock

    def _drop(self):
        sock, self._sock = self._sock, None
        self._rhave = 0
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def _call_code(self, func_id, body, schema, type_code):
        """Send one request whose reply is an expected<T> and return it as a code: OK, the
        server's error code, or the code of a failed call."""
        try:
            ok, value = self._call(func_id, body, schema, type_code)
        except _CallFailed as failed:
            return failed.code
        return OK if ok else value

    def _call(self, func_id, body, schema=None, type_code=None, decoder=None):
        """Send one request and decode its reply (with decoder(payload) when given, else
        against schema and type_code); raises _CallFailed with the error code.

        body is bytes, or a list of bytes parts (joined with the header in one copy)."""
        with self._lock:
            if self._target is None:
                raise _CallFailed(CONDUCTOR_UNAVAILABLE)
            if self._sock is None:
                # An earlier failure dropped the connection; setup() stays in force, so reconnect.
                try:
                    self._sock = self._connect(self._target, self._connect_timeout)
                except OSError:
                    raise _CallFailed(RPC_FAIL) from None
            self._seq = (self._seq + 1) & 0xFFFFFFFF
            seq = self._seq
            deadline = time.monotonic() + self._request_timeout
            if type(body) is list:
                header = _wire.pack_request_header(seq, func_id, sum(map(len, body)))
                body.insert(0, header)
                data = b"".join(body)
            else:
                data = _wire.pack_request_header(seq, func_id, len(body)) + body
            try:
                self._send(data, deadline)
                err_code, payload = self._recv_reply(seq, deadline)
            except socket.timeout:
                # A late reply would be read as the answer to the next request: start afresh.
                self._drop()
                raise _CallFailed(RPC_TIMEOUT) from None
            except (OSError, _wire.WireError):
                self._drop()
                raise _CallFailed(RPC_FAIL) from None
        if err_code != 0:
            # Framework error (unknown function, bad body...): the stream is still in step.
            raise _CallFailed(RPC_FAIL, err_code)
        try:
            if decoder is not None:
                return decoder(payload)
            return _wire.decode(schema, type_code, payload)
        except _wire.WireError:
            raise _CallFailed(RPC_FAIL) from None

    def _send(self, data, deadline):
        sock = self._sock
        sock.settimeout(_remaining(deadline))
        sent = sock.send(data)
        if sent == len(data):
            return
        view = memoryview(data)[sent:]
        while view:
            sock.settimeout(_remaining(deadline))
            sent = sock.send(view)
            view = view[sent:]

    def _recv_reply(self, seq, deadline):
        """Read one reply: (err_code, body bytes without the attachment)."""
        sock = self._sock
        buf = self._rbuf
        view = memoryview(buf)
        have = self._rhave
        self._rhave = 0
        while have < _wire.RESPONSE_HEADER_SIZE:
            sock.settimeout(_remaining(deadline))
            k = sock.recv_into(view[have:])
            if k == 0:
                raise ConnectionResetError("connection closed by the conductor")
            have += k
        err_code, got_seq, length, attach = _wire.unpack_response_header(view[: _wire.RESPONSE_HEADER_SIZE])
        if got_seq != seq:
            raise _wire.WireError("response seq %d for request %d" % (got_seq, seq))
        if length + attach > _MAX_RESPONSE_BYTES:
            raise _wire.WireError("response of %d bytes exceeds the limit" % (length + attach))
        start = _wire.RESPONSE_HEADER_SIZE
        end = start + length + attach
        if end <= have:
            payload = bytes(view[start : start + length])
            if end < have:
                buf[: have - end] = buf[end:have]
                self._rhave = have - end
            return err_code, payload
        # The rest of a reply longer than what arrived: read exactly that, nothing past it.
        rest = bytearray(end - start)
        got = have - start
        rest[:got] = view[start:have]
        view.release()
        rview = memoryview(rest)
        need = len(rest)
        while got < need:
            sock.settimeout(_remaining(deadline))
            k = sock.recv_into(rview[got:])
            if k == 0:
                raise ConnectionResetError("connection closed by the conductor")
            got += k
        rview.release()
        if attach:
            del rest[length:]
        return err_code, bytes(rest)


def _remaining(deadline):
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout("request timed out")
    return left


def _profile_dict(profile):
    strategy, algorithm, seed, root_digest, projection = profile
    return {
        "strategy": strategy,
        "algorithm": algorithm,
        "python_hash_seed": seed,
        "root_digest": root_digest,
        "index_projection": projection,
    }


def _profile_ext_dict(ext):
    """The hash_profile fields of issue 25 that are set, as /services shows them."""
    extra_keys, lora_path, lookahead = ext
    out = {}
    if extra_keys and extra_keys != "untagged":
        out["extra_keys"] = extra_keys
    if lora_path:
        out["lora_path"] = lora_path
    if lookahead:
        out["lookahead_tokens"] = lookahead
    return out


def _service_dict(cfg):
    (endpoint, replay, kind, model_name, lora_name, tenant_id, instance_id, block_size, dp_rank, group, profile) = cfg
    return {
        "Endpoint": endpoint,
        "ReplayEndpoint": replay,
        "Type": _wire.PUBLISHER_NAMES.get(kind, str(kind)),
        "ModelName": model_name,
        "LoraName": lora_name,
        "TenantID": tenant_id,
        "InstanceID": instance_id,
        "BlockSize": block_size,
        "DPRank": dp_rank,
        "CacheGroup": group,
        "HashProfile": _profile_dict(profile),
    }


def _service_config(config):
    """Validate a register() dict; return the ServiceConfig tuple in wire order, the
    profile fields of issue 25 as (extra_keys, lora_path, lookahead_tokens) or None when
    none is given, and index_media as a list or None."""
    if not isinstance(config, dict):
        raise ValueError("config must be a dict, got %s" % type(config).__name__)
    for key in config:
        if not isinstance(key, str):
            raise ValueError("config keys must be str, got %r" % (key,))
        if key not in _REGISTER_KEYS:
            raise ValueError("unknown config key %r" % key)
    for key in _REGISTER_STR_KEYS:
        if key in config:
            _check_str(key, config[key])
    publisher_type = config.get("publisher_type", "vLLM")
    if publisher_type not in _wire.PUBLISHER_KINDS:
        raise ValueError("publisher_type must be one of 'vLLM', 'SGLang', 'Mooncake', got %r" % publisher_type)
    block_size = _check_int("block_size", config.get("block_size", 0), _INT64_MIN, _INT64_MAX)
    dp_rank = _check_int("dp_rank", config.get("dp_rank", 0), _INT32_MIN, _INT32_MAX)
    cache_group = config.get("cache_group")
    if cache_group is not None:
        _check_int("cache_group", cache_group, _INT64_MIN, _INT64_MAX)
    profile = config.get("hash_profile", {})
    if not isinstance(profile, dict):
        raise ValueError("hash_profile must be a dict, got %s" % type(profile).__name__)
    for key, value in profile.items():
        if not isinstance(key, str):
            raise ValueError("hash_profile keys must be str, got %r" % (key,))
        if key == "root_digest":
            raise ValueError("hash_profile must not contain root_digest: the server derives it")
        if key == "lookahead_tokens":
            _check_int("hash_profile.lookahead_tokens", value, 0, _INT64_MAX)
            continue
        if key not in _PROFILE_KEYS and key not in _PROFILE_EXT_STR_KEYS:
            raise ValueError("unknown hash_profile key %r" % key)
        _check_str("hash_profile." + key, value)
    ext = None
    if any(k in profile for k in _PROFILE_EXT_KEYS):
        ext = (profile.get("extra_keys", ""), profile.get("lora_path", ""), profile.get("lookahead_tokens", 0))
    media = config.get("index_media")
    if media is not None:
        if not isinstance(media, (list, tuple)):
            raise ValueError("index_media must be a list of str, got %s" % type(media).__name__)
        media = [_check_str("index_media[%d]" % i, m) for i, m in enumerate(media)]
    return (
        (
            config.get("endpoint", ""),
            config.get("replay_endpoint", ""),
            _wire.PUBLISHER_KINDS[publisher_type],
            config.get("model_name", ""),
            config.get("lora_name", ""),
            _tenant(config.get("tenant_id", "")),
            config.get("instance_id", ""),
            block_size,
            dp_rank,
            cache_group,
            (
                profile.get("strategy", ""),
                profile.get("algorithm", ""),
                profile.get("python_hash_seed", ""),
                "",
                profile.get("index_projection", ""),
            ),
        ),
        ext,
        media,
    )


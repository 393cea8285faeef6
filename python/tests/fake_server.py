"""A coro_rpc server stand-in for client tests: real sockets, scripted replies.

It parses request frames with its own struct formats (not the client's codec), records
every request, and answers through a handler, so the tests see exactly what the client
put on the wire.
"""

import socket
import struct
import threading
import time

REQ_HEADER = struct.Struct("<BBBBIIII")
RESP_HEADER = struct.Struct("<BBBBIII")

#: Handler result meaning "read the request and never answer".
SILENT = object()


class Reply:
    """A scripted reply: body plus optional framework err_code and seq override."""

    def __init__(self, body, err_code=0, seq=None, magic=21):
        self.body = body
        self.err_code = err_code
        self.seq = seq
        self.magic = magic


class Request:
    """One parsed request frame."""

    def __init__(self, conn_id, header, body):
        magic, version, serialize_type, msg_type, seq, func_id, length, attach = header
        self.conn_id = conn_id
        self.magic = magic
        self.version = version
        self.serialize_type = serialize_type
        self.msg_type = msg_type
        self.seq = seq
        self.func_id = func_id
        self.length = length
        self.attach = attach
        self.body = body


def _recv_exact(conn, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = conn.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return bytes(buf)


class FakeServer:
    """Listens on an ephemeral port; handler(request) returns Reply, bytes, or SILENT."""

    def __init__(self, handler, host="127.0.0.1", family=socket.AF_INET):
        self.handler = handler
        self.requests = []
        self.errors = []
        self.accepted = 0
        self.closed_conns = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._conns = []
        self._threads = []
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, 0))
        self._listener.listen(64)
        # A short accept timeout lets stop() end the accept loop without tricks.
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self.address = ("[%s]:%d" if family == socket.AF_INET6 else "%s:%d") % (host, self.port)
        t = threading.Thread(target=self._accept_loop, daemon=True)
        t.start()
        self._threads.append(t)

    def _accept_loop(self):
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.settimeout(None)
            with self._lock:
                if self._stop.is_set():
                    conn.close()
                    return
                self.accepted += 1
                conn_id = self.accepted
                self._conns.append(conn)
                t = threading.Thread(target=self._serve, args=(conn, conn_id), daemon=True)
                self._threads.append(t)
            t.start()

    def _serve(self, conn, conn_id):
        try:
            while True:
                raw = _recv_exact(conn, REQ_HEADER.size)
                if raw is None:
                    return
                header = REQ_HEADER.unpack(raw)
                body = _recv_exact(conn, header[6] + header[7])
                if body is None:
                    return
                req = Request(conn_id, header, body)
                with self._lock:
                    self.requests.append(req)
                if (req.magic, req.version, req.serialize_type, req.msg_type, req.attach) != (21, 0, 0, 0, 0):
                    self.errors.append("bad request header %r" % (header,))
                try:
                    reply = self.handler(req)
                except Exception as exc:  # reported to the test, which fails on self.errors
                    self.errors.append("handler raised %r" % (exc,))
                    return
                if reply is SILENT:
                    continue
                if isinstance(reply, bytes):
                    reply = Reply(reply)
                seq = req.seq if reply.seq is None else reply.seq
                conn.sendall(RESP_HEADER.pack(reply.magic, 0, reply.err_code, 0, seq, len(reply.body), 0) + reply.body)
        except OSError:
            return
        finally:
            with self._lock:
                self.closed_conns += 1
            conn.close()

    def wait_closed(self, count, timeout=5.0):
        """Wait until count client connections have ended (the client closed them)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                if self.closed_conns >= count:
                    return True
            time.sleep(0.01)
        return False

    def stop(self):
        """Close the listener and every connection, then join the threads."""
        self._stop.set()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                c.close()
            except OSError:
                pass
        for t in list(self._threads):
            t.join(timeout=5)
        self._listener.close()

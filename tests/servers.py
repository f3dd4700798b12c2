"""Real servers for the remote tests, started on loopback ports by the tests themselves.

``s3_server()``: moto's standalone S3 server behind ``CountingProxy``, a plain HTTP/1.1
forwarder that records every request the client sent (method, path, Range header, status,
body bytes sent back), the most requests it had in flight at once, and can answer with
errors or cut a response short on demand. ``nginx()``: Debian's nginx serving a directory,
its access log recording the bytes sent and the Range header of each request.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


@dataclass
class Seen:
    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int


@dataclass
class Faults:
    status: int = 0  # answer this status instead of forwarding...
    count: int = 0  # ...to this many requests (-1: all)
    drop: int = 0  # cut this many GET responses after half their body


@dataclass
class Log:
    seen: list[Seen] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def clear(self) -> None:
        with self.lock:
            self.seen.clear()
            self.max_in_flight = 0

    def settle(self, timeout: float = 30) -> None:
        """Wait until no request is being handled. A client that gave up on a request
        (its connection dropped under load) and sent it again got its answer, while the
        proxy may still be handling the first one and log it later."""
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)

    def gets(self) -> list[Seen]:
        with self.lock:
            return [s for s in self.seen if s.method == "GET"]


class CountingProxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.log = Log()
        self.faults = Faults()
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: CountingProxy

    def log_message(self, *args: object) -> None:
        pass

    def _forward(self) -> None:
        log, faults = self.server.log, self.server.faults
        with log.lock:
            log.in_flight += 1
            log.max_in_flight = max(log.max_in_flight, log.in_flight)
            inject = faults.count != 0 and faults.status
            if inject and faults.count > 0:
                faults.count -= 1
            drop = self.command == "GET" and faults.drop > 0 and not inject
            if drop:
                faults.drop -= 1
        try:
            body = self._body()
            if inject:
                payload = b"<Error><Code>ServiceUnavailable</Code></Error>"
                self._record(inject, len(payload))
                self.send_response(inject)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            conn = http.client.HTTPConnection(*self.server.upstream, timeout=60)
            skip = ("connection", "transfer-encoding", "content-length", "expect")
            headers = {k: v for k, v in self.headers.items() if k.lower() not in skip}
            if body is not None:
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(k, v)
            length = resp.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(data)))
            self.end_headers()
            # logged before the client can see the answer, so that a log read after a
            # call returns holds every request the call made
            if drop:
                self._record(resp.status, len(data) // 2)
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._record(resp.status, 0 if self.command == "HEAD" else len(data))
            if self.command != "HEAD":
                self.wfile.write(data)
        finally:
            with log.lock:
                log.in_flight -= 1

    def _body(self) -> bytes | None:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    def _record(self, status: int, nbytes: int) -> None:
        with self.server.log.lock:
            self.server.log.seen.append(
                Seen(self.command, self.path, self.headers.get("Range"), status, nbytes)
            )

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward


@dataclass
class S3:
    proxy: CountingProxy
    options: dict  # storage_options for s3fs

    @property
    def log(self) -> Log:
        return self.proxy.log

    def fs(self):  # a fresh filesystem (no instance cache), same options
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, **self.options)


@contextlib.contextmanager
def s3_server(own_process: bool = False) -> Iterator[S3]:
    """moto behind the counting proxy; ``own_process``: moto runs in a process of its own
    (for benchmarks: in this one it competes with the client for the GIL)."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    if own_process:
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
        moto: Any = _Process(subprocess.Popen(command, stderr=subprocess.DEVNULL))
        _wait_for(port, moto.proc)
    else:
        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        moto.start()
        reset_moto(port)  # moto keeps its buckets per process: start from none
    proxy = CountingProxy(("127.0.0.1", port))
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": proxy.url},
        # only our retries: botocore's own would hide how many requests a fault costs
        "config_kwargs": {"retries": {"max_attempts": 1, "mode": "standard"}},
    }
    try:
        yield S3(proxy, options)
    finally:
        proxy.shutdown()
        proxy.server_close()
        moto.stop()


def reset_moto(port: int) -> None:
    """Empty a moto server: its backends are global to the process that runs it, so an
    earlier test module's buckets would still be there."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("POST", "/moto-api/reset")
        if conn.getresponse().status != 200:
            raise RuntimeError("moto did not reset")
    finally:
        conn.close()


class _Process:
    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _wait_for(port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server on port {port} did not start") from None
            time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Nginx:
    url: str
    root: Path
    access_log: Path

    def requests(self) -> list[tuple[str, int, int, str]]:
        """(request line, status, body bytes sent, Range header) per logged request."""
        out = []
        for line in self.access_log.read_text().splitlines():
            request, status, sent, rng = line.split("\t")
            out.append((request, int(status), int(sent), rng))
        return out

    def clear(self) -> None:
        self.access_log.write_text("")


CONFIG = """
daemon off;
user root;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 256; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  log_format counted "$request\\t$status\\t$body_bytes_sent\\t$http_range";
  open_file_cache off;
  server {{
    listen 127.0.0.1:{port};
    access_log {tmp}/access.log counted;
    location / {{ root {root}; {options} }}
  }}
}}
"""


@contextlib.contextmanager
def nginx(root: Path, tmp: Path, options: str = "") -> Iterator[Nginx]:
    """nginx serving ``root``; ``options``: more directives for its location (``etag off;``)."""
    port = free_port()
    conf = tmp / "nginx.conf"
    conf.write_text(CONFIG.format(tmp=tmp, port=port, root=root, options=options))
    proc = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(tmp)], stderr=subprocess.PIPE)
    try:
        _wait_for(port, proc)
        log = tmp / "access.log"
        log.touch()
        yield Nginx(f"http://127.0.0.1:{port}", root, log)
    finally:
        proc.terminate()
        proc.wait(10)


def have_nginx() -> bool:
    return os.access(NGINX, os.X_OK)

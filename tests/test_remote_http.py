"""HTTP servers that misbehave, for the reader's answer-checking and failure rules (README
"Object storage", FORMAT.md section 15): a tiny server started here, serving one container
by ranged GETs as nginx does, until told to fail (a 503 for the next n requests) or to
answer another range than the one asked. Attacker findings C01-C03 of session 12.
"""

from __future__ import annotations

import re
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

import evalue_store as evs
from evalue_store.errors import RemoteError
from evalue_store.physical import remote, remote_http
from evalue_store.physical.remote import RETRIES

pytest.importorskip("aiohttp")
pytest.importorskip("fsspec")


class Served(ThreadingHTTPServer):
    """One object at ``/obj.evs`` (strong ETag), every request logged as (method, Range)."""

    daemon_threads = True

    def __init__(self, data: bytes):
        self.data = data
        # "ok", "wrong-range" (8 bytes earlier, honestly labelled), "shrunk", "hang" (ranged
        # GETs get no answer), or a HEAD refused: "head-405", "head-403" (GETs served)
        self.mode = "ok"
        self.released = threading.Event()  # ends the hangs
        self.failing = 0  # answer 503 to this many requests (-1: all)
        self.log: list[tuple[str, str | None]] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/obj.evs"

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that gave up on a request (a timeout) resets its connection: not the
        server's error to print; anything else is."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Served

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        srv, asked = self.server, self.headers.get("Range")
        srv.log.append((self.command, asked))
        if srv.failing:
            srv.failing -= srv.failing > 0
            return self._answer(503, b"busy", {})
        if self.path != "/obj.evs":
            return self._answer(404, b"", {})
        if self.command == "HEAD" and srv.mode.startswith("head-"):
            return self._answer(int(srv.mode[5:]), b"", {})
        if srv.mode == "hang" and asked is not None:
            srv.released.wait(30)  # accepted, never answered
            return None
        data, etag = srv.data, '"v1"'
        if self.headers.get("If-Match") not in (None, etag):
            return self._answer(412, b"", {})
        headers = {"ETag": etag, "Accept-Ranges": "bytes"}
        if self.command == "HEAD" or asked is None:
            return self._answer(200, data, headers)
        a, b = (int(x) for x in re.fullmatch(r"bytes=(\d+)-(\d+)", asked).groups())
        total = len(data)
        if srv.mode == "wrong-range":
            a, b = max(0, a - 8), max(0, a - 8) + b - a
        elif srv.mode == "shrunk":  # the object became shorter: the range clipped to it
            total = len(data) // 2
            b = min(b, total - 1)
        headers["Content-Range"] = f"bytes {a}-{b}/{total}"
        return self._answer(206, data[a : b + 1], headers)

    do_HEAD = do_GET


@pytest.fixture
def served(tmp_path) -> Iterator[Served]:
    path = tmp_path / "d.evs"
    with evs.Writer(path) as w:
        for i in range(3000):
            w.append([np.full(64, i, np.int64), i])
    server = Served(path.read_bytes())
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.released.set()
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch):
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)


def test_an_answer_for_another_range_is_refused_not_believed(served):
    """FORMAT.md 15 rule 2, README "never wrong data": a 206 whose Content-Range names
    another range than the one asked was taken as the bytes asked, and a 3000-record object
    opened as an empty dataset (C01). Now a RemoteError names the URL and both ranges; an
    answer saying the object now has another size is the object changed (FormatError)."""
    served.mode = "wrong-range"
    with pytest.raises(RemoteError, match=r"/obj\.evs: the server answered bytes \d+-\d+ to a"):
        evs.open(served.url)
    served.mode = "ok"
    ds = evs.open(served.url)
    assert len(ds) == 3000 and ds[1500][1] == 1500
    served.mode = "wrong-range"
    with pytest.raises(RemoteError, match=r"request for bytes \d+-\d+"):
        ds[2100]
    served.mode = "shrunk"
    with pytest.raises(evs.FormatError, match="changed since it was opened") as err:
        ds[700]
    assert err.value.code == "changed" and served.url in str(err.value)


def test_server_errors_during_a_read_are_retried_then_named(served):
    """README "On failure": a 5xx is retried 4 times with backoff, then RemoteError naming
    URL and range. Over HTTP a 503 was reported at once as the object changed ("gone"),
    after an unranged GET of the whole object (C02)."""
    ds = evs.open(served.url)
    served.log.clear()
    served.failing = RETRIES  # unavailable for as many requests as there are retries
    assert ds[1603][1] == 1603
    assert all(r for m, r in served.log if m == "GET")  # never the whole object
    served.failing = -1
    served.log.clear()
    with pytest.raises(
        RemoteError, match=rf"/obj\.evs: bytes \d+-\d+ failed after {RETRIES + 1}"
    ) as e:
        ds[2900]
    named = str(e.value).split(": bytes ")[1].split(" failed")[0]
    asked = {r.split("=")[1] for m, r in served.log if m == "GET"}
    assert named in asked, f"the error names bytes {named}; the requests asked for {asked}"
    served.failing = 0
    assert ds[2900][1] == 2900


def test_server_errors_at_open_are_retried_and_never_file_not_found(served):
    """README "On failure": a missing object is FileNotFoundError, a server that fails is
    retried and then RemoteError. A 503 at open was FileNotFoundError at once (C03)."""
    served.failing = 3
    assert len(evs.open(served.url)) == 3000
    served.log.clear()
    served.failing = -1
    with pytest.raises(RemoteError, match=r"/obj\.evs: info failed after .* HTTP 503"):
        evs.open(served.url)
    assert len(served.log) == RETRIES + 1 and all(m == "HEAD" for m, _ in served.log)
    served.failing = 0
    with pytest.raises(FileNotFoundError, match="nothing.evs"):
        evs.open(served.url.replace("obj.evs", "nothing.evs"))


def test_a_server_that_never_answers_fails_as_a_dropped_connection(served, monkeypatch):
    """README "On failure": a request that fails is retried, then RemoteError. A server that
    accepted a ranged GET and never answered held ds[i] forever (attacker finding, session
    12, twelfth run, C02): no request had a timeout. Now one that sends nothing for
    READ_TIMEOUT_S (20 s; shortened here) fails and is retried as a dropped connection."""
    monkeypatch.setattr(remote_http, "READ_TIMEOUT_S", 0.3)
    ds = evs.open(served.url)
    served.mode = "hang"
    with pytest.raises(RemoteError, match=rf"bytes \d+-\d+ failed after {RETRIES + 1} tries"):
        ds[1700]
    served.mode = "ok"
    assert ds[1700][1] == 1700


@pytest.mark.parametrize("status", [403, 405])
def test_a_server_that_refuses_head_is_opened_by_a_ranged_get(served, status):
    """FORMAT.md 15 rule 3: only a server error is retried. A server refusing HEAD (405, or
    403 as a presigned GET URL does) but serving ranged GETs could not be opened: its 405
    was retried as a failure, then RemoteError (attacker finding, session 12, twelfth run,
    C03). The object's size and ETag now come from a GET of its first byte."""
    served.mode = f"head-{status}"
    served.log.clear()
    ds = evs.open(served.url)
    assert len(ds) == 3000 and ds[1700][1] == 1700
    assert ("GET", "bytes=0-0") in served.log and all(r for m, r in served.log if m == "GET")

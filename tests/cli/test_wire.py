"""astraeus.cli.wire (astra's HTTP/1.1 on a socket for http:// APIs) against real sockets, and pinned to http.client:
the same server bytes read through both give the same status, reason, headers and body."""

from __future__ import annotations

import http.client
import socket
import threading

import pytest

from astraeus.cli import wire


class Canned:
    """A TCP server on 127.0.0.1 that answers each request it reads with the next of `answers` (raw bytes), keeping
    the connection open between them unless an answer is None (then it closes). Records the requests it read."""

    def __init__(self, answers: list[bytes | None]):
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while self.answers:
            conn, _ = self.srv.accept()
            self.connections += 1
            with conn:
                buf = b""
                while self.answers:
                    while b"\r\n\r\n" not in buf:
                        data = conn.recv(65536)
                        if not data:
                            break
                        buf += data
                    if b"\r\n\r\n" not in buf:
                        break
                    head, _, buf = buf.partition(b"\r\n\r\n")
                    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length:")), 0)
                    while len(buf) < length:
                        buf += conn.recv(65536)
                    self.requests.append(head + b"\r\n\r\n" + buf[:length])
                    buf = buf[length:]
                    answer = self.answers.pop(0)
                    if answer is None:
                        break
                    conn.sendall(answer)
                    if b"Connection: close" in answer or (b"Content-Length" not in answer and b"chunked" not in answer):
                        break


def read_both(answer: bytes, method: str = "GET") -> tuple[tuple, tuple]:
    out = []
    for make in (wire.Connection, http.client.HTTPConnection):
        srv = Canned([answer])
        conn = make("127.0.0.1", srv.port, timeout=5)
        conn.request(method, "/x", body=None, headers={"Accept": "*/*"})
        r = conn.getresponse()
        out.append((r.status, r.reason, [(k.lower(), v) for k, v in r.getheaders()], r.read()))
        conn.close()
    return out[0], out[1]


ANSWERS = {
    "length": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"a\": true}",
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7;x=1\r\n, world\r\n0\r\nT: 1\r\n\r\n",
    "to the end": b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it until the end",
    "empty 204": b"HTTP/1.1 204 No Content\r\nX-A: 1\r\nX-A: 2\r\n\r\n",
    "error": b"HTTP/1.1 422 Unprocessable Entity\r\nContent-Length: 2\r\n\r\n{}",
    "http/1.0": b"HTTP/1.0 200 OK\r\n\r\nold",
}


@pytest.mark.parametrize("kind", list(ANSWERS))
def test_the_same_answer_as_http_client(kind):
    ours, theirs = read_both(ANSWERS[kind])
    assert ours == theirs


def test_head_has_no_body():
    ours, theirs = read_both(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n", method="HEAD")
    assert ours == theirs and ours[3] == b""


def test_a_kept_alive_connection_serves_the_next_request_and_sends_the_body():
    srv = Canned([b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
                  b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"])
    conn = wire.Connection("127.0.0.1", srv.port, timeout=5)
    conn.request("POST", "/api/v1/runs", body=b'{"n": 1}', headers={"Authorization": "Bearer t"})
    assert conn.getresponse().read() == b"ok"
    conn.request("GET", "/api/v1/runs?limit=1", headers={})
    assert conn.getresponse().read() == b"hi"
    assert srv.connections == 1
    first = srv.requests[0].decode()
    assert first.startswith("POST /api/v1/runs HTTP/1.1\r\n")
    assert f"Host: 127.0.0.1:{srv.port}\r\n" in first and "Content-Length: 8\r\n" in first
    assert first.endswith('{"n": 1}')
    conn.close()


def test_streaming_reads_each_chunk_as_it_comes():
    srv = Canned([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab\n\r\n3\r\ncd\n\r\n0\r\n\r\n"])
    conn = wire.Connection("127.0.0.1", srv.port, timeout=5)
    conn.request("GET", "/logs?follow=true")
    r = conn.getresponse()
    got = []
    while data := r.read1(65536):
        got.append(data)
    assert b"".join(got) == b"ab\ncd\n"


@pytest.mark.parametrize("answer, says", [
    (b"SMTP nonsense\r\n\r\n", "not an HTTP/1.x status line"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "not a header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: ten\r\n\r\n", "is not a number"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\nshort", "bytes before the answer's end"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "not a chunk size"),
    (None, "closed the connection without an answer"),
])
def test_a_broken_answer_is_a_protocol_error_that_says_what(answer, says):
    srv = Canned([answer])
    conn = wire.Connection("127.0.0.1", srv.port, timeout=5)
    conn.request("GET", "/")
    with pytest.raises(wire.ProtocolError, match=says):
        conn.getresponse().read()
    conn.close()

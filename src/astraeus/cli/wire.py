"""HTTP/1.1 over a plain socket, for `astra` talking to an http:// API: the part of http.client's connection and
response the CLI's client uses (request, getresponse, status, reason, getheaders, getheader, read, read1), without
importing http.client, which imports ssl and email whatever the URL. Bodies are read by Content-Length, chunked
transfer coding, or to the connection's end; a connection is kept alive unless the server closes it.
https:// goes through http.client (astraeus.cli.client). Standard library only: the C socket module (`_socket`)
itself, as socket.py's enums and selectors cost a command's start, with a buffered reader over it.
"""

from __future__ import annotations

import _socket
import io

MAX_LINE = 65536  # as http.client's limits: a longer status or header line is refused
MAX_HEADERS = 100


class ProtocolError(Exception):
    """The server's answer is not HTTP/1.x as this client reads it."""


class Response:
    def __init__(self, conn: Connection, method: str):
        self._conn = conn
        self._fp = conn.fp
        line = self._line()
        version, _, rest = line.partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {line[:80]!r}")
        self.status = int(code)
        self.reason = reason.strip()
        self._headers: list[tuple[str, str]] = []
        while True:
            h = self._line()
            if not h:
                break
            if len(self._headers) >= MAX_HEADERS:
                raise ProtocolError(f"more than {MAX_HEADERS} headers")
            k, sep, v = h.partition(":")
            if not sep:
                raise ProtocolError(f"not a header line: {h[:80]!r}")
            self._headers.append((k.strip(), v.strip()))
        te = (self.getheader("transfer-encoding") or "").lower()
        self._chunked = "chunked" in te
        self._left: int | None = None  # bytes left of a Content-Length body or of the current chunk
        self._done = method == "HEAD" or self.status in (204, 304) or 100 <= self.status < 200
        length = self.getheader("content-length")
        if not self._chunked and not self._done:
            if length is not None:
                if not length.strip().isdigit():
                    raise ProtocolError(f"Content-Length {length!r} is not a number")
                self._left = int(length)
                self._done = self._left == 0
            else:
                conn.will_close = True  # the body ends with the connection
        if (self.getheader("connection") or "").lower() == "close" or version == "HTTP/1.0":
            conn.will_close = True
        if self._done:
            self._finish()

    def _line(self) -> str:
        raw = self._fp.readline(MAX_LINE + 1)
        if len(raw) > MAX_LINE:
            raise ProtocolError("a line of the answer is too long")
        if not raw:
            raise ProtocolError("the server closed the connection without an answer")
        return raw.decode("latin-1").rstrip("\r\n")

    def getheaders(self) -> list[tuple[str, str]]:
        return list(self._headers)

    def getheader(self, name: str, default: str | None = None) -> str | None:
        name = name.lower()
        values = [v for k, v in self._headers if k.lower() == name]
        return ", ".join(values) if values else default

    def _finish(self) -> None:
        self._done = True
        if self._conn.will_close:
            self._conn.close()

    def read1(self, n: int = 65536) -> bytes:
        """At most n bytes of the body as they arrive (b"" at its end)."""
        if self._done:
            return b""
        if self._chunked:
            if not self._left:
                size = self._line().split(";", 1)[0].strip()
                try:
                    self._left = int(size, 16)
                except ValueError:
                    raise ProtocolError(f"not a chunk size: {size[:40]!r}") from None
                if self._left == 0:
                    while self._line():  # trailers, up to the blank line
                        pass
                    self._finish()
                    return b""
            data = self._fp.read1(min(n, self._left))
            if not data:
                raise ProtocolError("the connection ended inside a chunk")
            self._left -= len(data)
            if self._left == 0:
                self._line()  # the CRLF after the chunk's data
            return data
        if self._left is None:  # to the connection's end
            data = self._fp.read1(n)
            if not data:
                self._finish()
            return data
        data = self._fp.read1(min(n, self._left))
        if not data:
            raise ProtocolError(f"the connection ended {self._left} bytes before the answer's end")
        self._left -= len(data)
        if self._left == 0:
            self._finish()
        return data

    def read(self) -> bytes:
        """The rest of the body."""
        parts = []
        while True:
            data = self.read1(1 << 20)
            if not data:
                return b"".join(parts)
            parts.append(data)


class _SocketReader(io.RawIOBase):
    """A socket's receiving side as raw IO, for io.BufferedReader (socket.makefile's SocketIO, reading only)."""

    def __init__(self, sock: _socket.socket):
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        return self._sock.recv_into(b)


def create_connection(host: str | bytes, port: int, timeout: float | None) -> _socket.socket:
    """A connected TCP socket to the first of host's addresses that answers (socket.create_connection's rule)."""
    error: OSError | None = None
    for family, kind, proto, _name, address in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as e:
            error = e
            sock.close()
    raise error or OSError(f"getaddrinfo returned no address for {host!r}")


class Connection:
    def __init__(self, host: str, port: int, timeout: float | None = None):
        self.host, self.port, self.timeout = host, port, timeout
        self.sock: _socket.socket | None = None
        self.fp = None
        self.will_close = False

    def connect(self) -> None:
        # An ASCII host as bytes: getaddrinfo then skips the IDNA codec, whose import a command's start would pay.
        host = self.host.encode("ascii") if self.host.isascii() else self.host
        self.sock = create_connection(host, self.port, self.timeout)
        self.fp = io.BufferedReader(_SocketReader(self.sock))
        self.will_close = False

    def close(self) -> None:
        if self.fp is not None:
            self.fp.close()
            self.fp = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def request(self, method: str, target: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> None:
        if self.sock is None:
            self.connect()
        assert self.sock is not None
        self._method_sent = method
        host = self.host if self.port == 80 else f"{self.host}:{self.port}"
        if ":" in self.host:  # an IPv6 literal
            host = f"[{self.host}]" if self.port == 80 else f"[{self.host}]:{self.port}"
        lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Accept-Encoding: identity"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        head = "\r\n".join(lines) + "\r\n\r\n"
        self.sock.sendall(head.encode("latin-1") + (body or b""))

    def getresponse(self) -> Response:
        if self.sock is None:
            raise ProtocolError("no request was sent")
        return Response(self, self._method_sent)

    _method_sent = "GET"

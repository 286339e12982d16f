"""The reward server's HTTP layer: the request handler and the threaded server that bound what a connection takes
(the limits are described in :mod:`sage_grpo.rewards.serving`). The handler serves ``server.service``, a
:class:`~sage_grpo.rewards.serving.RewardService`."""

from __future__ import annotations

import json
import socket
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .remote import redact_secrets
from .serving_request import RequestError, ServerLimits

BODY_CHUNK_BYTES = 1 << 20


class _ConnectionDropped(Exception):
    """The client stalled or went away mid-request: close without an answer (nobody reads it)."""


class RewardRequestHandler(BaseHTTPRequestHandler):
    """One connection: ``GET /info`` and ``POST /score`` for ``server.service`` (a :class:`RewardHTTPServer`'s)."""

    @property
    def service(self):
        return self.server.service

    @property
    def timeout(self) -> float:  # StreamRequestHandler sets it on the socket: bounds every read and write
        return self.service.limits.idle_timeout_s

    def setup(self):
        super().setup()
        self._slot = False
        # hard bounds: shutting the socket down ends any blocked read with EOF. The head's is short: until its
        # headers have arrived a client is unauthenticated; the whole request's covers a trickled body
        limits = self.service.limits
        self._deadlines = [threading.Timer(seconds, self._drop) for seconds in
                           (limits.header_timeout_s, limits.request_timeout_s)]
        for deadline in self._deadlines:
            deadline.daemon = True
            deadline.start()

    def _drop(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def parse_request(self) -> bool:  # reads the headers: the head has arrived when it returns
        parsed = super().parse_request()
        self._deadlines[0].cancel()
        return parsed

    def finish(self):
        for deadline in self._deadlines:
            deadline.cancel()
        if self._slot:
            self.server.release_slot()
        super().finish()

    def log_message(self, format, *args):  # noqa: A002 - http.server's signature
        super().log_message("%s", redact_secrets(format % args))  # no query string or userinfo in a log line

    def _answer(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _admitted(self) -> bool:
        """Authenticated and holding a serving slot; otherwise answered (401 or 503), closed, False."""
        if not self.service.authorized(self.headers.get("Authorization")):
            self.close_connection = True  # the body, if any, is never read
            self._answer(401, {"error": "missing or wrong token: send 'Authorization: Bearer <token>' with the "
                                        "token of the server's --auth_token_file (the client reads it from "
                                        "SAGE_GRPO_REWARD_TOKEN)"})
            return False
        self._slot = self.server.take_slot()
        if not self._slot:
            self.close_connection = True
            self._answer(503, {"error": f"the reward server is serving --max_connections "
                                        f"{self.service.limits.max_connections} requests; retry later"})
        return self._slot

    def do_GET(self):  # noqa: N802 - http.server's naming
        self._deadlines[1].cancel()
        if not self._admitted():
            return
        if self.path != "/info":
            return self._answer(404, {"error": f"unknown path {self.path!r}; use GET /info or POST /score"})
        self._answer(200, self.service.info())

    def do_POST(self):  # noqa: N802
        if not self._admitted():
            return
        if self.path != "/score":
            self.close_connection = True
            return self._answer(404, {"error": f"unknown path {self.path!r}; use POST /score"})
        try:
            length = self._content_length()
            self.service.reserve_buffer(length)
        except RequestError as err:
            self.close_connection = True
            return self._answer(err.status, {"error": str(err)})
        try:
            self._score(length)
        finally:
            self.service.release_buffer(length)

    def _score(self, length: int) -> None:
        try:
            body = self._read_body(length)
            self._deadlines[1].cancel()  # delivered: scoring may take as long as the model needs
            self._answer(200, self.service.score(body))
        except _ConnectionDropped:
            self.close_connection = True
        except RequestError as err:
            self._answer(err.status, {"error": str(err)})
        except Exception as err:  # noqa: BLE001 - reported to the client as a 500, which it retries
            traceback.print_exc()
            self._answer(500, {"error": f"{type(err).__name__}: {err}"})

    def _content_length(self) -> int:
        length = self.headers.get("Content-Length", "")
        if not (length.isascii() and length.isdigit()):
            raise RequestError("a Content-Length header is required", status=411)
        if int(length) > self.service.limits.max_request_bytes:
            raise RequestError(f"the body of {length} bytes exceeds --max_request_mb "
                               f"({self.service.limits.max_request_bytes} bytes); send fewer videos", status=413)
        return int(length)

    def _read_body(self, length: int) -> bytearray:
        """The body, read into one buffer of its length (no growing copies; the frames become a view of it)."""
        body = bytearray(length)
        with memoryview(body) as view:
            done = 0
            while done < length:  # each read waits at most idle_timeout_s; the deadline bounds the total
                try:
                    count = self.rfile.readinto(view[done:done + BODY_CHUNK_BYTES])
                except (TimeoutError, ConnectionError) as err:
                    raise _ConnectionDropped() from err
                if not count:
                    raise _ConnectionDropped()
                done += count
        return body


class RewardHTTPServer(ThreadingHTTPServer):
    """The threaded server: every connection has a thread, at most ``max_connections + max_pending_connections`` at
    once (the next one gets 503 and is closed); an authenticated request takes one of ``max_connections`` serving
    slots (:meth:`take_slot`) for as long as it is read, scored and answered."""

    daemon_threads = True

    def __init__(self, address, service, handler_class: type[BaseHTTPRequestHandler] = RewardRequestHandler):
        self.service = service
        limits: ServerLimits = service.limits
        self._open = threading.BoundedSemaphore(limits.max_connections + limits.max_pending_connections)
        self._slots = threading.BoundedSemaphore(limits.max_connections)
        super().__init__(address, handler_class)

    def take_slot(self) -> bool:
        return self._slots.acquire(blocking=False)

    def release_slot(self) -> None:
        self._slots.release()

    def process_request(self, request, client_address):
        if not self._open.acquire(blocking=False):
            _refuse_busy(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # the thread did not start: its place would never come back
            self._open.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._open.release()

    def handle_error(self, request, client_address):
        err = sys.exc_info()[1]
        if isinstance(err, OSError):  # a client that vanished or a connection dropped at its deadline
            print(f"reward server: connection from {client_address[0]} ended: {err}", file=sys.stderr)
        else:
            super().handle_error(request, client_address)


def _refuse_busy(request: socket.socket) -> None:
    """Answer 503 from the accepting thread: a few hundred bytes fit any send buffer, and the timeout bounds it."""
    data = b'{"error": "the reward server has as many connections open as it allows; retry later"}'
    try:
        request.settimeout(1.0)
        request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(data), data))
    except OSError:
        pass

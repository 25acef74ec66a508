#!/usr/bin/env python3
"""lane-router.py — one endpoint, several models: each request to the lane serving the model it
names (issue 41; the standard library only, as the image's python3 runs it).

    lane-router.py --listen 127.0.0.1:8102 \
        --lane coder=/run/twinspark-vllm/coder.sock --lane fast=10.0.0.2:8001 \
        --drain-dir /run/twinspark-drain

A lane is a unix socket (an engine on this node) or HOST:PORT (its gateway on another node, which
checks the key again: the request's Authorization header goes through as it came).

It sits behind the API gateway (nginx keeps the key, the limits, the path check and /health) on a
unix socket or the head's loopback. A request's `model` (the JSON body's top-level key) picks the lane whose engine serves
that name, as that engine's own /v1/models lists it (read at start and again when a name is not
known: a lane swapped to another model is found without a restart; asked with the key of the request
being answered, as a lane's gateway wants one and the router keeps none); a request without `model` goes
to the first lane, as vLLM serves its first name then. The request is passed on unchanged and the
answer streamed back byte for byte (SSE included); a client that leaves closes the lane's
connection, so vLLM aborts the request. `GET /v1/models` lists every lane's models. An unknown
model gets vLLM's own 404 (Anthropic's shape on /v1/messages). While `<drain-dir>/<lane>` exists
that lane answers 503 with Retry-After (the gateway's drain shape) and the others serve on.

Why our own: nginx's JavaScript module is not packaged for the serving image's Ubuntu 22.04, nginx
alone cannot read a JSON body's key soundly, vllm-router balances copies of one model (and speaks
HTTP only), LiteLLM re-serialises streams and answers an unknown model with its own 400
(docs/measurements/router-overhead-2026-12-06.md measures the hop this adds).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Optional

HEAD_LIMIT = 64 * 1024  # request line and headers: nginx's own large_client_header_buffers order
BODY_LIMIT = 64 * 1024 * 1024  # the gateway's client_max_body_size
CHUNK = 64 * 1024
MODELS_TIMEOUT_S = 10.0
DRAINING_RETRY_AFTER_S = 60


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} lane-router: {message}", file=sys.stderr, flush=True)


def http_response(status: int, reason: str, body: bytes, extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            f"{extra}Connection: close\r\n\r\n").encode() + body


def unknown_model(path: str, model: str) -> bytes:
    """vLLM's answer to a model it does not serve (its OpenAI server's NotFoundError; Anthropic's shape
    on /v1/messages, as vLLM's Anthropic endpoint answers)."""
    message = f"The model `{model}` does not exist."
    if path.split("?")[0].rstrip("/") == "/v1/messages":
        body = {"type": "error", "error": {"type": "not_found_error", "message": message}}
    else:
        body = {"error": {"message": message, "type": "NotFoundError", "param": None, "code": 404}}
    return http_response(404, "Not Found", json.dumps(body).encode())


def draining(lane: str) -> bytes:
    body = {"error": {"message": f"lane {lane} is draining for a change; retry shortly", "type": "ServiceUnavailable",
                      "param": None, "code": 503}}
    return http_response(503, "Service Unavailable", json.dumps(body).encode(),
                         f"Retry-After: {DRAINING_RETRY_AFTER_S}\r\n")


def bad_request(message: str) -> bytes:
    body = {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
    return http_response(400, "Bad Request", json.dumps(body).encode())


class Request:
    """One HTTP/1.x request as the gateway sent it: its head's lines and its whole body."""

    def __init__(self, method: str, path: str, version: str, headers: list[tuple[str, str]], body: bytes):
        self.method, self.path, self.version, self.headers, self.body = method, path, version, headers, body

    def header(self, name: str) -> Optional[str]:
        return next((v for k, v in self.headers if k.lower() == name), None)

    def forwarded(self) -> bytes:
        """The request as it came, framed by Content-Length and closed after its answer."""
        kept = [(k, v) for k, v in self.headers
                if k.lower() not in ("content-length", "transfer-encoding", "connection", "keep-alive")]
        lines = [f"{self.method} {self.path} HTTP/1.1"] + [f"{k}: {v}" for k, v in kept]
        lines += [f"Content-Length: {len(self.body)}", "Connection: close"]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + self.body


async def read_request(reader: asyncio.StreamReader) -> Optional[Request]:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    except asyncio.LimitOverrunError:
        raise ValueError("request head too large") from None
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, path, version = lines[0].split(" ")
    except ValueError:
        raise ValueError("malformed request line") from None
    headers = [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in lines[1:] if line)]
    request = Request(method, path, version, headers, b"")
    if (request.header("transfer-encoding") or "").lower() == "chunked":
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")  # no trailers from the gateway
                break
            body += await reader.readexactly(size + 2)
            del body[-2:]
            if len(body) > BODY_LIMIT:
                raise ValueError("request body too large")
        request.body = bytes(body)
    else:
        length = int(request.header("content-length") or 0)
        if length > BODY_LIMIT:
            raise ValueError("request body too large")
        request.body = await reader.readexactly(length) if length else b""
    return request


def requested_model(request: Request) -> Optional[str]:
    """The body's top-level `model`, or None where there is none (vLLM: its first name)."""
    if not request.body:
        return None
    try:
        body = json.loads(request.body)
    except ValueError:
        return None  # the lane's engine answers a broken body with its own 400
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else None


def address(value: str) -> tuple[str, int]:
    """HOST:PORT -> (HOST, PORT); ValueError where it is not one."""
    host, colon, port = value.rpartition(":")
    if not (colon and host and port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(value)
    return host, int(port)


async def open_lane(lane: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A unix socket's path, or HOST:PORT."""
    if lane.startswith("/"):
        return await asyncio.open_unix_connection(lane)
    return await asyncio.open_connection(*address(lane))


class Router:
    def __init__(self, lanes: dict[str, str], drain_dir: Optional[str]):
        self.lanes = lanes  # name -> the lane's socket or HOST:PORT, in the stack's order (the first: no `model`)
        self.drain_dir = Path(drain_dir) if drain_dir else None
        self.models: dict[str, str] = {}  # served name -> lane
        self.listed: dict[str, list] = {}  # lane -> its /v1/models `data`

    # ---- the lanes' engines ------------------------------------------------------------------
    async def ask(self, lane: str, request: bytes) -> bytes:
        reader, writer = await asyncio.wait_for(open_lane(self.lanes[lane]), MODELS_TIMEOUT_S)
        try:
            writer.write(request)
            await writer.drain()
            return await asyncio.wait_for(reader.read(), MODELS_TIMEOUT_S)
        finally:
            writer.close()

    async def refresh(self, authorization: Optional[str] = None) -> None:
        """Each lane's served names, from its engine's /v1/models (a lane that does not answer, or
        wants a key this request did not bring, keeps what it listed last)."""
        key = f"Authorization: {authorization}\r\n" if authorization else ""
        question = f"GET /v1/models HTTP/1.1\r\nHost: lane\r\n{key}Connection: close\r\n\r\n".encode("latin-1")

        async def one(lane: str) -> None:
            try:
                answer = await self.ask(lane, question)
                status = int(answer.split(b" ", 2)[1])
                data = json.loads(answer.split(b"\r\n\r\n", 1)[1]).get("data") if status == 200 else None
            except (OSError, ValueError, IndexError, asyncio.TimeoutError, AttributeError):
                return
            if isinstance(data, list):
                self.listed[lane] = data
        await asyncio.gather(*(one(lane) for lane in self.lanes))
        self.models = {entry["id"]: lane for lane in self.lanes for entry in self.listed.get(lane, [])
                       if isinstance(entry, dict) and isinstance(entry.get("id"), str)}

    async def lane_for(self, model: Optional[str], authorization: Optional[str]) -> Optional[str]:
        if model is None:
            return next(iter(self.lanes))
        if model not in self.models:
            await self.refresh(authorization)  # a lane swapped to another model since, or not yet asked
        return self.models.get(model)

    def drained(self, lane: str) -> bool:
        return self.drain_dir is not None and (self.drain_dir / lane).exists()

    # ---- one client connection -----------------------------------------------------------------
    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                request = await read_request(reader)
            except (ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as err:
                writer.write(bad_request(str(err)))
                return
            if request is None:
                return
            if request.method == "GET" and request.path.split("?")[0].rstrip("/") == "/v1/models":
                await self.refresh(request.header("authorization"))
                listed = [entry for lane in self.lanes for entry in self.listed.get(lane, [])]
                writer.write(http_response(200, "OK", json.dumps({"object": "list", "data": listed}).encode()))
                return
            model = requested_model(request)
            lane = await self.lane_for(model, request.header("authorization"))
            if lane is None:
                writer.write(unknown_model(request.path, model or ""))
                return
            if self.drained(lane):
                writer.write(draining(lane))
                return
            await self.relay(lane, request, reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client left
        finally:
            try:
                await writer.drain()
            except ConnectionError:
                pass
            writer.close()

    async def relay(self, lane: str, request: Request, client: asyncio.StreamReader,
                    writer: asyncio.StreamWriter) -> None:
        """The request to the lane's engine, its answer back as it comes; either side closing ends both."""
        try:
            up_reader, up_writer = await open_lane(self.lanes[lane])
        except OSError as err:
            body = {"error": {"message": f"lane {lane} is not serving: {err.strerror}", "type": "ServiceUnavailable",
                              "param": None, "code": 503}}
            writer.write(http_response(503, "Service Unavailable", json.dumps(body).encode()))
            return
        up_writer.write(request.forwarded())

        async def answer() -> None:
            while chunk := await up_reader.read(CHUNK):
                writer.write(chunk)
                await writer.drain()

        async def client_gone() -> None:
            await client.read()  # EOF: the gateway closed (its client left)

        tasks = [asyncio.ensure_future(answer()), asyncio.ensure_future(client_gone())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            up_writer.close()


def parse_lane(value: str) -> tuple[str, str]:
    name, sep, lane = value.partition("=")
    if not sep or not name or not (lane.startswith("/") or is_address(lane)):
        raise argparse.ArgumentTypeError(f"--lane expects NAME=/absolute/socket/path or NAME=HOST:PORT, got {value!r}")
    return name, lane


def is_address(value: str) -> bool:
    try:
        address(value)
    except ValueError:
        return False
    return True


def parse_listen(value: str) -> str:
    if not (value.startswith("/") or is_address(value)):
        raise argparse.ArgumentTypeError(f"--listen expects /absolute/socket/path or HOST:PORT, got {value!r}")
    return value


async def serve(args: argparse.Namespace) -> None:
    router = Router(dict(args.lane), args.drain_dir)
    await router.refresh()
    if args.listen.startswith("/"):
        listen = Path(args.listen)
        listen.unlink(missing_ok=True)
        old_umask = os.umask(0o007)  # the gateway's group reaches it, no one else (as vLLM's socket)
        try:
            server = await asyncio.start_unix_server(router.handle, str(listen), limit=HEAD_LIMIT)
        finally:
            os.umask(old_umask)
    else:  # loopback: whoever reaches it still meets each lane's gateway, which checks the key
        host, port = address(args.listen)
        server = await asyncio.start_server(router.handle, host, port, limit=HEAD_LIMIT)
    log(f"listening on {args.listen}: lanes {', '.join(f'{n} ({len(router.listed.get(n, []))} models)' for n in router.lanes)}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=parse_listen, required=True,
                        help="the unix socket or HOST:PORT the gateway proxies to")
    parser.add_argument("--lane", type=parse_lane, action="append", required=True,
                        help="NAME=SOCKET or NAME=HOST:PORT: a lane's engine or gateway; the first also serves "
                        "requests that name no model")
    parser.add_argument("--drain-dir", help="while DIR/<lane> exists that lane answers 503")
    args = parser.parse_args(argv)
    names = [name for name, _ in args.lane]
    if len(set(names)) != len(names):
        parser.error(f"--lane names must differ, got {', '.join(names)}")
    asyncio.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

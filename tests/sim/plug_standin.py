"""A smart plug for each simulated node, Shelly Gen1's HTTP API: `GET /plug/NODE/relay/0?turn=off|on`
behind basic auth. Off is the node's power cut (SimCluster.power_off: every process killed, a
frozen one too); on boots it from its disk (SimCluster.power_on), in the background, as a plug
answers at once and the box boots by itself. The URL in Pulumi.sim.yaml (sim2's power.url, a
secret: http://admin:sim-plug-secret@plug.twinspark-sim:8099/plug/sim2) names it; node_init.py
names plug.twinspark-sim the node's gateway. Requests from another site's nodes are refused, so
one site's plug never switches another's nodes.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PORT = 8099
CREDENTIALS = ("admin", "sim-plug-secret")


class PlugStandin:
    def __init__(self, cluster, lan: ipaddress.IPv4Network, port: int = PORT):
        self.cluster, self.lan, self.events = cluster, lan, []  # (time, node, "off"|"on"|"refused ...")
        self.booted = threading.Event()
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_):
                pass

            def do_GET(self):
                standin.handle(self)

        self.server = ThreadingHTTPServer(("0.0.0.0", port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "PlugStandin":
        self.thread.start()
        return self

    def __exit__(self, *_):
        self.server.shutdown()
        self.server.server_close()

    def answer(self, handler, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def handle(self, handler) -> None:
        url = urlsplit(handler.path)
        parts = url.path.strip("/").split("/")
        expected = "Basic " + base64.b64encode(":".join(CREDENTIALS).encode()).decode()
        if ipaddress.ip_address(handler.client_address[0]) not in self.lan:
            self.events.append((time.time(), "", f"refused {handler.client_address[0]}: another site"))
            return self.answer(handler, 403, {"error": "not this site's plug"})
        if handler.headers.get("Authorization") != expected:
            handler.send_response(401)
            handler.send_header("WWW-Authenticate", 'Basic realm="shelly"')
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            self.events.append((time.time(), "", "refused: no credentials"))
            return None
        turn = parse_qs(url.query).get("turn", [""])[0]
        if len(parts) != 4 or parts[0] != "plug" or parts[2:] != ["relay", "0"] or parts[1] not in self.cluster.nodes \
                or turn not in ("on", "off"):
            return self.answer(handler, 404, {"error": f"no such relay or turn: {url.path}?{url.query}"})
        node = parts[1]
        self.events.append((time.time(), node, turn))
        if turn == "off":
            self.cluster.power_off(node)
        else:
            threading.Thread(target=self._boot, args=(node,), daemon=True).start()
        return self.answer(handler, 200, {"ison": turn == "on", "has_timer": False})

    def _boot(self, node: str) -> None:
        self.cluster.power_on(node)
        self.booted.set()

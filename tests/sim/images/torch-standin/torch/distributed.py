"""torch.distributed over TCP, for the stand-in's tensors (torch/__init__.py says what it is).

init_process_group("nccl", init_method="tcp://HOST:PORT", ...) as torch's TCP store does it:
rank 0 listens on HOST:PORT, every other rank connects until `timeout`. all_reduce sums the
ranks' values at rank 0 and hands the sum back. NCCL's INFO lines, as NCCL would print them
for the network that reached the container, go to NCCL_DEBUG_FILE (%h host, %p pid).
"""

import json
import os
import socket
import time
from datetime import timedelta

_group = None


class _Group:
    def __init__(self, rank: int, world_size: int, peers: list):
        self.rank, self.world_size, self.peers = rank, world_size, peers  # rank 0: one socket a peer

    def exchange(self, value: float) -> float:
        if self.rank == 0:
            total = value + sum(json.loads(_line(conn))["value"] for conn in self.peers)
            for conn in self.peers:
                conn.sendall((json.dumps({"value": total}) + "\n").encode())
            return total
        (conn,) = self.peers
        conn.sendall((json.dumps({"value": value}) + "\n").encode())
        return json.loads(_line(conn))["value"]


def _line(conn) -> str:
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            raise RuntimeError("stand-in all_reduce: a peer closed the connection")
        data += chunk
    return data.decode()


def _network() -> str:
    ib_devices = os.path.isdir("/dev/infiniband") and any(n.startswith("uverbs") for n in os.listdir("/dev/infiniband"))
    if ib_devices and os.environ.get("NCCL_IB_HCA") and os.environ.get("NCCL_IB_DISABLE") != "1":
        return "IB"
    return "Socket"


# NCCL opens its debug file once a process, truncating it (src/debug.cc ncclDebugInit: fopen(debugFn, "w")):
# a restarted engine whose PID repeats (a container's PID namespace) leaves no earlier start's lines
_debug_mode = "w"


def _debug(lines: list) -> None:
    global _debug_mode
    path = os.environ.get("NCCL_DEBUG_FILE")
    if not path or os.environ.get("NCCL_DEBUG") != "INFO":
        return
    path = path.replace("%h", socket.gethostname()).replace("%p", str(os.getpid()))
    with open(path, _debug_mode) as out:
        _debug_mode = "a"
        for line in lines:
            out.write(f"{socket.gethostname()}:{os.getpid()} NCCL INFO {line}\n")


def init_process_group(backend: str, init_method: str, rank: int, world_size: int,
                       timeout: timedelta = timedelta(minutes=30)) -> None:
    global _group
    host, port = init_method.removeprefix("tcp://").rsplit(":", 1)
    deadline = time.monotonic() + timeout.total_seconds()
    if rank == 0:
        with socket.create_server((host, int(port))) as server:
            peers = []
            while len(peers) < world_size - 1:
                server.settimeout(max(deadline - time.monotonic(), 0.001))
                peers.append(server.accept()[0])
    else:
        while True:
            try:
                peers = [socket.create_connection((host, int(port)), timeout=5)]
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        peers[0].settimeout(None)
    network = _network()
    hca = os.environ.get("NCCL_IB_HCA", "")
    _debug([f"NCCL_SOCKET_IFNAME set to {os.environ.get('NCCL_SOCKET_IFNAME', '')}",
            f"NET/IB : Using {hca} (twinspark-sim stand-in: no RDMA)" if network == "IB" else "NET/IB : No device found.",
            f"Using network {network}"])
    _group = _Group(rank, world_size, peers)


def all_reduce(tensor) -> None:
    tensor.value = _group.exchange(tensor.value)


def destroy_process_group() -> None:
    global _group
    for conn in _group.peers:
        conn.close()
    _group = None

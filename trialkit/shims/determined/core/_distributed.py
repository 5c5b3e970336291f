"""`det.core.DistributedContext`: ranks, and gather / allgather / broadcast of small Python objects.

Determined runs these over ZeroMQ; here they run over plain sockets in a
star around the chief (rank 0): each worker connects once, and a message is
a length-prefixed pickle. On one node the star is a Unix socket in Linux's
abstract namespace named after the trial and its run (no port to collide
with another trial's); across nodes it is TCP on the chief's address at
Determined's port (12360 + port_offset). The local variants use a second
star around each node's local chief when the job spans nodes; on one node
they are the global ones. Every call is collective, as Determined's:
every rank of the star must make it, in the same order.
"""
import os
import pickle
import socket
import struct
import time
from typing import Any, List, Optional

from trialkit import env

PORT = 12360  # Determined's INTER_TRAIN_PROCESS_COMM_PORT_1
CONNECT_SECONDS = 300.0  # how long a worker waits for its chief to listen (Determined waits as long)
_HEADER = struct.Struct("!Q")


class _Star:
    """The chief's end (`peers` connected workers, by rank) or a worker's (one socket to the chief)."""

    def __init__(self, address: Any, family: int, rank: int, size: int):
        self.rank = rank
        if rank == 0:
            listener = socket.socket(family, socket.SOCK_STREAM)
            if family == socket.AF_INET:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(address)
            listener.listen(size)
            peers = {}
            with listener:
                while len(peers) < size - 1:
                    conn, _ = listener.accept()
                    peers[_recv(conn)] = conn
            self.peers = [peers[r] for r in sorted(peers)]
        else:
            self.chief = _connect(address, family)
            _send(self.chief, rank)

    def gather(self, stuff: Any) -> Optional[List[Any]]:
        if self.rank == 0:
            return [stuff] + [_recv(peer) for peer in self.peers]
        _send(self.chief, stuff)
        return None

    def broadcast(self, stuff: Any) -> Any:
        if self.rank == 0:
            for peer in self.peers:
                _send(peer, stuff)
            return stuff
        return _recv(self.chief)

    def close(self) -> None:
        for sock in self.peers if self.rank == 0 else [self.chief]:
            sock.close()


def _connect(address: Any, family: int) -> socket.socket:
    deadline = time.monotonic() + CONNECT_SECONDS
    while True:
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.connect(address)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _send(sock: socket.socket, stuff: Any) -> None:
    data = pickle.dumps(stuff)
    sock.sendall(_HEADER.pack(len(data)) + data)


def _recv(sock: socket.socket) -> Any:
    (size,) = _HEADER.unpack(_read(sock, _HEADER.size))
    return pickle.loads(_read(sock, size))


def _read(sock: socket.socket, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError("a peer of this distributed job closed its connection (it ended or failed)")
        buf += chunk
    return bytes(buf)


class DistributedContext:
    """Determined's: rank, size, local_rank, local_size, cross_rank, cross_size; chief_ip when cross_size > 1."""

    def __init__(self, *, rank: int, size: int, local_rank: int, local_size: int, cross_rank: int,
                 cross_size: int, chief_ip: Optional[str] = None, pub_port: int = PORT, pull_port: int = PORT + 16,
                 port_offset: int = 0, force_tcp: bool = False) -> None:
        self.rank, self.size = rank, size
        self.local_rank, self.local_size = local_rank, local_size
        self.cross_rank, self.cross_size = cross_rank, cross_size
        if local_size != size and chief_ip is None:
            raise AssertionError("when cross_size > 1, the chief_ip parameter is required")
        self._closed = False
        self._global = self._local = None
        if size < 2:
            return
        trial = env.read()
        name = f"trialkit-det-{trial.experiment_id}-{trial.trial_id}-{trial.restart_count}-{pub_port + port_offset}"
        if cross_size == 1 and not force_tcp:
            self._global = _Star("\0" + name, socket.AF_UNIX, rank, size)
        else:
            self._global = _Star((chief_ip if rank else "0.0.0.0", pub_port + port_offset), socket.AF_INET,
                                 rank, size)
        if local_size == size:
            self._local = self._global
        elif local_size > 1:
            self._local = _Star(f"\0{name}-node{cross_rank}", socket.AF_UNIX, local_rank, local_size)

    @classmethod
    def from_torch_distributed(cls, chief_ip: Optional[str] = None) -> "DistributedContext":
        e = os.environ
        return cls(rank=int(e["RANK"]), size=int(e["WORLD_SIZE"]), local_rank=int(e["LOCAL_RANK"]),
                   local_size=int(e["LOCAL_WORLD_SIZE"]), cross_rank=int(e["GROUP_RANK"]),
                   cross_size=int(e["GROUP_WORLD_SIZE"]), chief_ip=chief_ip or _chief_ip())

    @classmethod
    def from_deepspeed(cls, chief_ip: Optional[str] = None) -> "DistributedContext":
        # Determined's deepspeed launcher sets LOCAL_SIZE, CROSS_RANK and CROSS_SIZE; trialkit's sets
        # torch's names and its topology, which answer the same.
        e, topo = os.environ, env.topology()
        return cls(rank=int(e["RANK"]), size=int(e["WORLD_SIZE"]), local_rank=int(e["LOCAL_RANK"]),
                   local_size=int(e.get("LOCAL_SIZE") or e.get("LOCAL_WORLD_SIZE") or topo.slots_per_node),
                   cross_rank=int(e.get("CROSS_RANK") or topo.node_rank),
                   cross_size=int(e.get("CROSS_SIZE") or topo.num_nodes), chief_ip=chief_ip or _chief_ip())

    @classmethod
    def from_horovod(cls, hvd: Any, chief_ip: Optional[str] = None) -> "DistributedContext":
        return cls(rank=hvd.rank(), size=hvd.size(), local_rank=hvd.local_rank(), local_size=hvd.local_size(),
                   cross_rank=hvd.cross_rank(), cross_size=hvd.cross_size(), chief_ip=chief_ip or _chief_ip())

    def get_rank(self) -> int:
        return self.rank

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_size(self) -> int:
        return self.size

    def get_num_agents(self) -> int:
        return self.cross_size

    def gather(self, stuff: Any) -> Optional[List[Any]]:
        """Every rank's `stuff` to the chief (a list by rank); None on the others."""
        return [stuff] if self._global is None else _gather(self._global, stuff)

    def gather_local(self, stuff: Any) -> Optional[List[Any]]:
        return [stuff] if self._local is None else _gather(self._local, stuff)

    def allgather(self, stuff: Any) -> List[Any]:
        """Every rank's `stuff`, by rank, to every rank."""
        return [stuff] if self._global is None else self._global.broadcast(self._global.gather(stuff))

    def allgather_local(self, stuff: Any) -> List[Any]:
        return [stuff] if self._local is None else self._local.broadcast(self._local.gather(stuff))

    def broadcast(self, stuff: Any) -> Any:
        """The chief's `stuff`, on every rank."""
        return stuff if self._global is None else self._global.broadcast(stuff)

    def broadcast_local(self, stuff: Any = None) -> Any:
        return stuff if self._local is None else self._local.broadcast(stuff)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for star in {id(s): s for s in (self._global, self._local) if s is not None}.values():
            star.close()


def _gather(star: _Star, stuff: Any) -> Optional[List[Any]]:
    out = star.gather(stuff)
    star.broadcast(None)  # as Determined: no rank starts the next call before the chief has this one's
    return out


def _chief_ip() -> Optional[str]:
    return os.environ.get("DET_CHIEF_IP") or env.topology().chief_addr


class DummyDistributedContext(DistributedContext):
    """One worker: what `core.init()` uses when given no DistributedContext."""

    def __init__(self) -> None:
        super().__init__(rank=0, size=1, local_rank=0, local_size=1, cross_rank=0, cross_size=1)

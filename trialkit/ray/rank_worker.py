"""One launcher worker on a Ray node: an actor that runs one wrap_rank there.

The launcher (trialkit.ray.horovod) places these actors and talks to
them only through their methods: where() (the node, for the rendezvous plan),
start() (wrap_rank in its own session, its stdout and stderr into pipes),
read() (the output that came, in whole lines, so that two ranks' lines never
mix in the launcher's stdout), wait() (the exit code), signal() and kill().
wrap_rank does the process control on the node as under every launcher: the
script in its own session, a stop signal forwarded once with the grace, then
SIGKILL. The actor is async, so signal() and read() are served while wait()
is pending, and it forks from its one event-loop thread: a parent-death
signal fires when the forking thread ends. When Ray kills the actor (the
launcher is gone), wrap_rank gets SIGTERM and stops its script gracefully.

The class is plain Python; the launcher wraps it with ray.remote, so
importing this module does not import ray.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from trialkit.process import Child, LaunchError, exit_code, signal_group, spawn

READ_SIZE = 1 << 16
Chunk = Tuple[int, bytes]  # (1 stdout | 2 stderr, whole lines)


def interface_of(address: str, interfaces: Mapping[str, Sequence]) -> Optional[str]:
    """The network interface that holds `address` (psutil.net_if_addrs()' shape), for gloo."""
    for name, addresses in interfaces.items():
        if any(getattr(a, "address", None) == address for a in addresses):
            return name
    return None


class RankWorker:
    def __init__(self) -> None:
        self._child: Optional[Child] = None
        self._pending: Dict[int, bytearray] = {}  # stream -> bytes read, not yet handed out
        self._open: List[int] = []  # streams whose pipe is not at EOF yet
        self._changed: Optional[asyncio.Event] = None
        self._unstartable: Optional[int] = None  # the exit code of a command that could not start

    async def where(self) -> Tuple[str, str, Optional[str]]:
        """(Ray node id, the node's address, its network interface)."""
        import psutil
        import ray

        address = ray.util.get_node_ip_address()
        return ray.get_runtime_context().get_node_id(), address, interface_of(address, psutil.net_if_addrs())

    async def start(self, argv: Sequence[str], environ: Mapping[str, str], cwd: Optional[str]) -> None:
        """Start argv with `environ` over this worker's own environment, in `cwd` (None: the actor's)."""
        loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        pipes = {1: os.pipe(), 2: os.pipe()}
        try:
            self._child = spawn(list(argv), env={**os.environ, **environ}, cwd=cwd, stdin=subprocess.DEVNULL,
                                stdout=pipes[1][1], stderr=pipes[2][1], parent_death_signal=signal.SIGTERM)
        except LaunchError as err:
            for read_end, _ in pipes.values():
                os.close(read_end)
            self._unstartable = err.code
            self._pending[2] = bytearray(f"{err}\n".encode())
            return
        finally:
            for _, write_end in pipes.values():
                os.close(write_end)
        for stream, (read_end, _) in pipes.items():
            os.set_blocking(read_end, False)
            self._pending[stream] = bytearray()
            self._open.append(stream)
            loop.add_reader(read_end, self._on_readable, stream, read_end)

    def _on_readable(self, stream: int, fd: int) -> None:
        try:
            data = os.read(fd, READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self._pending[stream] += data
        else:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)
            self._open.remove(stream)
        self._changed.set()

    async def read(self) -> List[Chunk]:
        """The whole lines that came since the last read (waits for some); [] once the output has ended."""
        while True:
            out = self._take()
            if out or not self._open:
                return out
            self._changed.clear()
            await self._changed.wait()

    def _take(self) -> List[Chunk]:
        out = []
        for stream, data in self._pending.items():
            # A line cut by a pipe read waits for its end; at EOF what is left goes out as it is.
            cut = len(data) if stream not in self._open else data.rfind(b"\n") + 1
            if cut:
                out.append((stream, bytes(data[:cut])))
                del data[:cut]
        return out

    async def wait(self) -> int:
        """wrap_rank's exit code, once it has exited."""
        child = self._child
        if child is None:
            return self._unstartable
        _, status = await asyncio.to_thread(os.waitpid, child.pid, 0)
        child.exit_code = exit_code(status)
        child.popen.returncode = child.exit_code  # Popen must not wait again
        return child.exit_code

    async def signal(self, signum: int) -> None:
        """To wrap_rank, which forwards it to the script's group (a stop signal once, with the grace)."""
        if self._child is not None and self._child.exit_code is None:
            os.kill(self._child.pid, signum)

    async def kill(self) -> None:
        """SIGKILL wrap_rank's group; its script dies with it (a parent-death signal)."""
        if self._child is not None and self._child.exit_code is None:
            signal_group(self._child.pgid, signal.SIGKILL)

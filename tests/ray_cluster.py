"""A real two-node Ray cluster on loopback for the cluster tests: head + one worker, torn down fully.

Each node is ``ray start --block`` in its own session (so its raylet, agents and workers form one
process group this helper can kill), with SIGINT restored (a background job of a non-interactive
shell would hand it down ignored, and a soft ``ray.cancel`` would then do nothing), token auth on
and ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: without it ``ray start`` replaces
``--node-ip-address=127.0.0.1`` with the host's external address and binds every interface.
Nodes are ``Popen`` children of the test, so a killed raylet's parent reaps it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fault_backend import worker_env

REPO = Path(__file__).resolve().parent.parent
FAKE_POPRT = REPO / "tests" / "fake_poprt"
WORKER_RESOURCE = "sharderd_test_worker"
"""Only worker nodes have it, so attempts asking for it never run on the head."""
_BESIDE = Path(sys.executable).with_name("ray")
_RAY = str(_BESIDE) if _BESIDE.exists() else (shutil.which("ray") or str(_BESIDE))
"""Ray's CLI of this interpreter; a venv made with --system-site-packages has none beside its
python, so the one on PATH."""
_KEEP_LOOPBACK = (
    "import sys; import ray._private.services as s; s.resolve_ip_for_localhost = lambda host: host; "
    "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; sys.exit(main())"
)
"""``ray start`` for a worker node that keeps 127.0.0.1 as given (Ray would swap in the external address)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker_ports(taken: set[int], width: int = 40) -> list[str]:
    """A worker port range clear of the ports given to the node's components: Ray refuses to start
    when the range holds one of them (a free port picked at random can fall inside it)."""
    for _ in range(100):
        low = free_port()
        if low + width < 65535 and not any(low <= port <= low + width for port in taken):
            return [f"--min-worker-port={low}", f"--max-worker-port={low + width}"]
    return []


def _restore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class Node:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    node_id: str = ""

    def descendants(self) -> list[int]:
        """Pids of every live process below this node's ``ray start`` (its process tree)."""
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                stat = (entry / "stat").read_text()
                fields = stat[stat.rfind(")") + 2 :].split()
                if fields[0] not in "ZX":
                    children.setdefault(int(fields[1]), []).append(int(entry.name))
        out, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(children.get(pid, []))
        return out

    def raylet_pid(self) -> int:
        for pid in self.descendants():
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                    return pid
        raise AssertionError(f"{self.name}: no raylet among {self.descendants()}")

    def kill(self) -> None:
        """SIGKILL the whole node (its process group), as a host that lost power; reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # what a graceful stop left
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


@dataclass
class RayCluster:
    root: Path
    port: int = field(default_factory=free_port)
    token_path: Path = field(init=False)
    nodes: list[Node] = field(default_factory=list)
    ray_temp: Path = field(init=False)
    """Ray's session folder, kept short: its AF_UNIX socket paths must fit 107 bytes, which a
    pytest (let alone pytest-xdist) tmp_path does not leave room for."""

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.ray_temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
        self.token_path = self.root / "auth_token"
        self.token_path.write_text(secrets.token_hex(32))
        self.token_path.chmod(0o600)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self, *, fake_poprt: bool = True) -> dict[str, str]:
        """Environment of the nodes and of any driver (the daemon) that joins them; the fault
        backend is registered, and ``fake_poprt`` puts the fake PopRT on the Python path."""
        base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "FAKE_POPRT_"))}
        env = {
            **base,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token_path),
            "RAY_USAGE_STATS_ENABLED": "0",
            "PYTHONPATH": os.pathsep.join([*([str(FAKE_POPRT)] if fake_poprt else []), str(REPO)]),
        }
        return worker_env(env)  # the attempts' workers run the tests' fault backend

    def _start(self, name: str, args: list[str], *, head: bool, fake_poprt: bool = True) -> Node:
        log = self.root / f"{name}.log"
        ports = [
            "--node-manager-port",
            "--object-manager-port",
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--runtime-env-agent-port",
            "--metrics-export-port",
        ]
        # A head told 127.0.0.1 keeps it only with the "not a cluster" switch; a worker refuses to
        # start with that switch, so it runs `ray start` with the loopback rewrite switched off.
        env = {
            **self.env(fake_poprt=fake_poprt),
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0" if head else "1",
        }
        cli = [_RAY] if head else [sys.executable, "-c", _KEEP_LOOPBACK]
        argv = [
            *cli,
            "start",
            "--block",
            "--node-ip-address=127.0.0.1",
            "--disable-usage-stats",
            "--object-store-memory=80000000",
            *args,
        ]
        taken = {self.port}
        for flag in ports:
            port = free_port()
            while port in taken:  # a port just released can come back: Ray refuses a repeat
                port = free_port()
            taken.add(port)
            argv.append(f"{flag}={port}")
        argv += _worker_ports(taken)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_restore_sigint,
            )
        node = Node(name, proc, log)
        self.nodes.append(node)
        deadline = time.monotonic() + 60
        while b"Ray runtime started" not in log.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{name} did not start:\n{log.read_text()[-3000:]}")
            select.select([], [], [], 0.1)  # the log is a file: nothing to wait on but time
        return node

    def start_head(self, *, num_cpus: int = 1, fake_poprt: bool = True) -> Node:
        self.ray_temp.mkdir(exist_ok=True)
        return self._start(
            "head",
            [
                "--head",
                f"--port={self.port}",
                "--include-dashboard=false",
                f"--num-cpus={num_cpus}",
                f"--temp-dir={self.ray_temp}",
            ],
            head=True,
            fake_poprt=fake_poprt,
        )

    def start_worker(
        self, name: str = "worker", *, resources: dict[str, float] | None = None
    ) -> Node:
        return self._start(
            name,
            [
                f"--address={self.address}",
                "--num-cpus=2",
                f"--resources={json.dumps(resources or {WORKER_RESOURCE: 2})}",
            ],
            head=False,
        )

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.stop()
        self.nodes.clear()
        shutil.rmtree(self.ray_temp, ignore_errors=True)

    def listening(self) -> list[str]:
        """Local addresses of every TCP/UDP socket listening in a process of this cluster."""
        pids = {pid for node in self.nodes for pid in node.descendants()}
        out = subprocess.run(
            ["ss", "-H", "-lntup"], capture_output=True, text=True, check=True
        ).stdout
        found = []
        for line in out.splitlines():
            owners = {
                int(p.split("=")[1])
                for p in line.split("users:")[-1].split(",")
                if p.startswith("pid=")
            }
            if owners & pids:
                found.append(line.split()[4])
        return found


@contextlib.contextmanager
def two_nodes(root: Path) -> Iterator[RayCluster]:
    cluster = RayCluster(root)
    try:
        cluster.start_head()
        cluster.start_worker()
        yield cluster
    finally:
        cluster.stop()


def daemon_cluster_section(cluster: RayCluster, root: Path, sdk_resource: str, **keys: Any) -> str:
    """The ``[cluster]`` section of a daemon config that runs attempts on ``cluster``, with its
    shared and sweep folders under ``root``; ``keys`` are further ``[cluster]`` keys (TOML values
    written as JSON, which TOML reads alike for numbers, strings and lists: ``schedule_timeout=60.0``)."""
    lines = [
        "",
        "[cluster]",
        'engine = "ray"',
        f'address = "{cluster.address}"',
        f'shared_dir = "{root / "shared"}"',
        f'sweep_dir = "{root / "sweep"}"',
        f'sdk_resource = "{sdk_resource}"',
        *(f"{key} = {json.dumps(value)}" for key, value in keys.items()),
    ]
    return "\n".join(lines) + "\n"

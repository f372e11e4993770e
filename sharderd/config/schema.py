"""The configuration schema: one frozen dataclass per ``sharderd.toml`` section, and ``Config``.

Each field's attribute docstring is its documentation (``sharderd.config.reference`` generates the
docs/config.md's reference and the shipped ``sharderd.toml`` from them). Range checks run in
``__post_init__`` and raise ``FieldError`` naming the key; the loader adds the file, table and line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sharderd.errors import ConfigError
from sharderd.target import BUILTIN_TARGETS, Target

__all__ = [
    "SECTIONS",
    "ClusterConfig",
    "Config",
    "DaemonConfig",
    "FieldError",
    "OrtConfig",
    "PlanConfig",
    "PoprtConfig",
    "SearchConfig",
]


class FieldError(ConfigError):
    """A field value out of range; the loader adds the file and table to the message."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key} {message}")
        self.key = key
        """The key within its table, dotted below it (``dims.sequence``)."""
        self.detail = message


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise FieldError(key.split(".", 1)[-1], message)


@dataclass(frozen=True, slots=True)
class PlanConfig:
    """How the engine costs and splits a model."""

    batch_size: int = 1
    """Value for a symbolic leading dim of a graph input that ``dims`` does not name."""
    dims: Mapping[str, int] = field(default_factory=dict)
    """Named symbolic dims, e.g. ``{ sequence = 128 }``, resolved before shape inference."""
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Whole static shapes of graph inputs, e.g. ``{ input_ids = [1, 128] }`` (PopRT's ``--input_shape``)."""
    precision: Literal["model", "fp32", "fp16"] = "model"
    """Plan and write at this precision (``fp16``: float weights and tensors in half, graph inputs and outputs keep their type); ``model``: as the file is."""
    keep_dynamic: bool = False
    """Write the sharded model with the input dims as the file had them, instead of the planned static shapes."""
    serialize: bool = True
    """Rewrite a node into pieces before planning: one whose weights alone exceed one device (an embedding Gather, a MatMul/Gemm with a constant weight), or a MatMul/Gemm with a constant weight whose own time holds the bottleneck up, when that lowers it by more than 10% (``--no-serialize``: never)."""
    safety_margin: float = 1.15
    """Predicted memory × margin must fit a device; absorbs fragmentation and model error."""
    name_nodes: bool = False
    """Give unnamed/duplicate nodes unique ``<OpType>_<k>`` names instead of refusing the model."""
    cost_model: Literal["analytic", "measured"] = "analytic"
    """``measured`` re-plans with onnxruntime profiler times (onnxruntime backend)."""

    def __post_init__(self) -> None:
        _check(self.batch_size >= 1, "plan.batch_size", "must be >= 1")
        _check(self.safety_margin >= 1.0, "plan.safety_margin", "must be >= 1.0")
        for name, value in self.dims.items():
            _check(
                isinstance(value, int) and value >= 1,
                f"plan.dims.{name}",
                "must be an integer >= 1",
            )
        for name, shape in self.input_shapes.items():
            _check(
                all(isinstance(d, int) and d >= 1 for d in shape),
                f"plan.input_shapes.{name}",
                "must be a list of integers >= 1",
            )


@dataclass(frozen=True, slots=True)
class SearchConfig:
    """How plans are proven by compile attempts."""

    backend: Literal["auto", "poprt", "onnxruntime", "none"] = "auto"
    """Who proves the plan: ``auto`` = poprt for an IPU target when the Poplar SDK imports, else onnxruntime, else none (plan only)."""
    max_attempts: int = 8
    """Compiles per job at most, speculative ones included."""
    parallel: int = 2
    """Attempts that may run at once (one-shot CLI; the daemon uses ``max_parallel_compiles``)."""
    attempt_timeout: float = 3600.0
    """Seconds before an attempt's process group gets SIGTERM."""
    kill_grace: float = 10.0
    """Seconds between SIGTERM and SIGKILL of a timed-out or cancelled attempt."""
    optimal_perf: bool = False
    """After the first success keep compiling and benchmarking the next-best plans."""
    amp_fallbacks: tuple[float, ...] = (0.3, 0.1)
    """``available_memory_proportion`` values retried when every plan is out of memory; the lowest of them and the default is the probe's (one node compiled alone: its overflow there proves exit 3, unless it is host-stream memory; a MatMul's only once it overflowed with PopART's matmul serialization too, in a compiled model that kept the attributes)."""
    speculative_margins: tuple[float, ...] = (1.3,)
    """Extra safety margins compiled in parallel with the plan when pool slots are free (after the probe, when there is one)."""
    amp_per_stage: bool = True
    """An AMP retry lowers ``available_memory_proportion`` only on the stage whose device ran out of memory (``__available_memory`` on its conv/matmul nodes), the other stages keep theirs; false: the whole compile's, as before. An out-of-memory text naming no device always retries the whole compile's."""

    def __post_init__(self) -> None:
        _check(self.max_attempts >= 1, "search.max_attempts", "must be >= 1")
        _check(self.parallel >= 1, "search.parallel", "must be >= 1")
        _check(self.attempt_timeout > 0, "search.attempt_timeout", "must be > 0")
        _check(self.kill_grace >= 0, "search.kill_grace", "must be >= 0")
        for amp in self.amp_fallbacks:
            _check(0 < amp <= 1, "search.amp_fallbacks", "values must be in (0, 1]")
        for margin in self.speculative_margins:
            _check(margin >= 1.0, "search.speculative_margins", "values must be >= 1.0")


@dataclass(frozen=True, slots=True)
class PoprtConfig:
    """CompilerOptions for the poprt backend (names as in ``poprt.compiler.CompilerOptions``)."""

    ipu_version: str = ""
    """Empty: ask ``poprt.runtime.DeviceManager().ipu_hardware_version()``."""
    partials_type: Literal["half", "float"] = "half"
    """Precision of matmul/conv partial sums (PopRT ``partials_type``)."""
    available_memory_proportion: float = 0.6
    """Share of tile memory the conv/matmul planner may use for temporaries (PopRT default 0.6)."""
    enable_pipelining: bool = True
    """Compile the stages as a pipeline (else plain model parallelism, one stage active at a time)."""
    batches_per_step: int = 0
    """0: the number of stages (PopART needs >= stages when pipelining)."""
    num_io_tiles: int = 0
    """Tiles reserved for overlapped I/O (0, or an even number >= 32)."""
    benchmark_warmup: int = 20
    """Untimed runs before benchmarking a compiled PopEF (``--optimal-perf``)."""
    benchmark_runs: int = 200
    """Timed runs of a compiled PopEF: one at a time for the median latency, then queued with ``execute_async`` for the throughput that ranks ``--optimal-perf``."""
    ipus: int = -1
    """IPUs of this host that benchmarks share: a run holds as many as its plan has devices, until it ends; -1: as many as ``DeviceManager().get_num_devices()`` says in the first compile attempt; 0: compile only (no measurement)."""

    def __post_init__(self) -> None:
        _check(
            0 < self.available_memory_proportion <= 1,
            "poprt.available_memory_proportion",
            "must be in (0, 1]",
        )
        _check(self.batches_per_step >= 0, "poprt.batches_per_step", "must be >= 0")
        _check(self.ipus >= -1, "poprt.ipus", "must be >= -1")
        _check(
            self.num_io_tiles == 0 or (self.num_io_tiles >= 32 and self.num_io_tiles % 2 == 0),
            "poprt.num_io_tiles",
            "must be 0 or an even number >= 32 (PopART's rule)",
        )


@dataclass(frozen=True, slots=True)
class OrtConfig:
    """The onnxruntime backend: where stages run and how results are checked."""

    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    """onnxruntime execution providers; with CUDA, stage i runs on device i."""
    rtol: float = 1e-3
    """Relative tolerance when comparing float outputs with the unsharded model."""
    atol: float = 1e-4
    """Absolute tolerance for the same comparison (integers and bools must match exactly)."""
    fp16_rtol: float = 1e-2
    """Relative tolerance when the stages run at fp16 (``plan.precision``) against the fp32 original."""
    fp16_atol: float = 1e-2
    """Absolute tolerance for the same fp16 comparison."""
    warmup: int = 3
    """Untimed runs per stage before measuring."""
    runs: int = 20
    """Timed runs per stage and pipeline micro-batches when measuring."""
    low_memory: bool = False
    """Create one stage session at a time and release it (peak = reference + largest stage)."""
    write_stages: bool = False
    """Also write the per-stage ONNX files to the output folder."""
    seed: int = 0
    """Seed of the generated verification inputs."""


@dataclass(frozen=True, slots=True)
class DaemonConfig:
    """``sharderd run``: folders, pool and lifecycle."""

    inbox: Path = Path("/var/lib/sharderd/inbox")
    """Where jobs are dropped: ``<name>.onnx`` or a folder ``<name>/`` (moved in with one rename)."""
    outbox: Path = Path("/var/lib/sharderd/outbox")
    """Where results appear, atomically, as ``<name>/``; must share a filesystem with inbox and state_dir."""
    state_dir: Path = Path("/var/lib/sharderd/state")
    """Holds ``processing/``, ``failed/``, ``done/`` and the job journal."""
    runtime_dir: Path | None = None
    """Where ``status.json`` lives; default ``$RUNTIME_DIRECTORY`` or ``state_dir``."""
    devices: int | Literal["auto"] = 2
    """Pipeline stages for jobs whose sidecar does not say; ``"auto"``: the fewest, up to ``max_devices``, whose predicted throughput is within 1% of a plan on ``max_devices`` (the rest stay free for other jobs)."""
    max_devices: int | None = None
    """With ``devices = "auto"``: the most devices a job may use (required there, unused otherwise)."""
    target: str | None = None
    """Default target for jobs; None: the ``[target]`` section's."""
    backend: Literal["auto", "poprt", "onnxruntime", "none"] = "auto"
    """Backend for jobs whose sidecar does not say (see ``search.backend``)."""
    max_parallel_compiles: int = 2
    """Compile attempts running at once across all jobs."""
    attempt_timeout: float = 3600.0
    """Seconds before an attempt's process group gets SIGTERM."""
    kill_grace: float = 10.0
    """Seconds between SIGTERM and SIGKILL of an attempt."""
    max_attempts: int = 8
    """Compile attempts per job; also its worker crashes when ``max_worker_crashes`` is unset."""
    planning_timeout: float = 600.0
    """Wall seconds a job's planning worker may spend analysing and planning, summed over the job (time waiting for compiles not counted); past it the job fails with reason ``planning_limit``. The 100k-node benchmark model plans in 14 s."""
    planning_memory_bytes: int = 8 * 1024**3
    """Resident memory a job's planning worker may hold (read ten times a second); past it the job fails with reason ``planning_limit``. The 100k-node benchmark model plans in 1.2 GiB. 0: no limit."""
    max_worker_crashes: int | None = None
    """Runs of a job whose planning worker (or the daemon itself) died, across restarts, before it goes to ``failed/``; unset: the job's ``max_attempts``."""
    settle_seconds: float = 5.0
    """A file unchanged (size, mtime, inode) this long is complete."""
    rescan_interval: float = 30.0
    """Seconds between full inbox rescans (lost events, a recreated inbox, network filesystems)."""
    watch_mode: Literal["auto", "inotify", "poll"] = "auto"
    """``poll`` for network filesystems; ``auto`` polls when the inbox is on NFS/CIFS/FUSE."""
    poll_interval: float = 2.0
    """Seconds between polls when polling."""
    keep_input: bool = True
    """Move inputs to ``state_dir/done/`` after success (else delete them)."""
    shutdown: Literal["kill", "drain"] = "kill"
    """On SIGTERM: ``kill`` running attempts (jobs resume at next start) or ``drain`` them."""
    shutdown_timeout: float = 60.0
    """Seconds a stop may take before running work is cancelled."""
    allow_root: bool = False
    """Refuse to run as root unless true."""
    file_mode: int = 0o640
    """Mode of files written to the outbox and failed/."""
    dir_mode: int = 0o750
    """Mode of folders written to the outbox and failed/."""
    metrics_textfile: Path | None = None
    """Prometheus textfile-collector path, rewritten atomically (unset: no metrics file)."""
    metrics_port: int | None = None
    """Also serve the metrics on ``http://127.0.0.1:PORT/metrics`` (needs ``prometheus-client``; 0: a free port, logged; unset: no port)."""

    def __post_init__(self) -> None:
        if self.devices == "auto":
            _check(
                self.max_devices is not None and self.max_devices >= 1,
                "daemon.max_devices",
                'must be set (>= 1) with devices = "auto"',
            )
        else:
            _check(self.devices >= 1, "daemon.devices", 'must be >= 1 or "auto"')
        _check(self.max_parallel_compiles >= 1, "daemon.max_parallel_compiles", "must be >= 1")
        _check(self.max_attempts >= 1, "daemon.max_attempts", "must be >= 1")
        _check(
            self.max_worker_crashes is None or self.max_worker_crashes >= 1,
            "daemon.max_worker_crashes",
            "must be >= 1",
        )
        _check(self.attempt_timeout > 0, "daemon.attempt_timeout", "must be > 0")
        _check(self.planning_timeout > 0, "daemon.planning_timeout", "must be > 0")
        _check(self.planning_memory_bytes >= 0, "daemon.planning_memory_bytes", "must be >= 0")
        _check(self.settle_seconds >= 0, "daemon.settle_seconds", "must be >= 0")
        _check(self.rescan_interval > 0, "daemon.rescan_interval", "must be > 0")
        _check(self.shutdown_timeout > 0, "daemon.shutdown_timeout", "must be > 0")
        _check(
            self.metrics_port is None or 0 <= self.metrics_port <= 65535,
            "daemon.metrics_port",
            "must be a TCP port, 0..65535",
        )

    def worker_crash_limit(self, max_attempts: int) -> int:
        """Runs a job may lose to a dying worker: ``max_worker_crashes``, else the job's
        ``max_attempts`` (its sidecar's or this section's), as before the key existed."""
        return max_attempts if self.max_worker_crashes is None else self.max_worker_crashes

    def worker_crash_key(self) -> str:
        """The key that set :meth:`worker_crash_limit`, for messages that tell what to raise."""
        return "max_attempts" if self.max_worker_crashes is None else "max_worker_crashes"


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """Where compile attempts run: on this host, or as Ray tasks on a cluster (``sharderd[ray]``)."""

    engine: Literal["local", "ray"] = "local"
    """``local``: attempts are subprocesses of the daemon; ``ray``: one Ray task per attempt."""
    address: str = "auto"
    """Ray cluster to join (``ray.init(address=...)``): ``auto`` (the node on this host) or ``HOST:PORT`` of the head."""
    shared_dir: Path | None = None
    """A folder every node sees at the same path (NFS): attempt folders and artifacts live there (required with ``ray``)."""
    sweep_dir: Path = Path("/tmp/sharderd-attempts")
    """Node-local folder where each node records its running attempts, so a sweeper kills what a crashed raylet leaves."""
    num_cpus: float = 1.0
    """Ray CPUs one attempt reserves (a Poplar compile is mostly single-threaded)."""
    memory_bytes: int = 0
    """Host memory one attempt needs: a job fails when no node has this much in all (Ray's ``memory`` request; not a limit); 0: none."""
    sdk_resource: str = ""
    """Custom Ray resource that marks hosts with the Poplar SDK (``ray start --resources '{"poplar_sdk": 1}'``): poprt (and ``auto``'s choice of it) is available when a live node has it, whatever the daemon's host imports; empty: any node, poprt must import on the daemon's host."""
    ipu_resource: str = ""
    """Custom Ray resource that counts a node's IPUs (``ray start --resources='{"ipu": 16}'``): a poprt benchmark run (``--optimal-perf``) asks for as many as its plan has devices; empty: none."""
    schedule_timeout: float = 300.0
    """Seconds an attempt may wait for a node that can hold it before its job fails naming the resource."""
    cancel_margin: float = 5.0
    """Seconds after ``kill_grace`` that a soft ``ray.cancel`` may take before the task is force-killed."""
    head_timeout: float = 60.0
    """Seconds the daemon waits for a Ray head (GCS) that stopped answering (``cluster.lost`` in the log; jobs wait for it); then it stops with exit 4 and log line ``daemon.stopped`` (reason ``cluster_lost``), for systemd's ``Restart=`` to start it again, and the jobs it held run again at the next start. 60 s is how long Ray's nodes wait for a lost head before they exit."""
    env_passthrough: tuple[str, ...] = ()
    """Daemon environment variables copied into each attempt on the node (e.g. ``POPLAR_ENGINE_OPTIONS``)."""

    def __post_init__(self) -> None:
        _check(
            self.engine != "ray" or self.shared_dir is not None,
            "cluster.shared_dir",
            'must be set when engine = "ray"',
        )
        _check(self.num_cpus >= 0, "cluster.num_cpus", "must be >= 0")
        _check(self.memory_bytes >= 0, "cluster.memory_bytes", "must be >= 0")
        _check(self.schedule_timeout > 0, "cluster.schedule_timeout", "must be > 0")
        _check(self.cancel_margin >= 0, "cluster.cancel_margin", "must be >= 0")
        _check(self.head_timeout > 0, "cluster.head_timeout", "must be > 0")
        _check(bool(self.address), "cluster.address", "must not be empty")


@dataclass(frozen=True, slots=True)
class Config:
    """Everything sharderd reads from ``sharderd.toml``; defaults when there is no file."""

    plan: PlanConfig = field(default_factory=PlanConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    poprt: PoprtConfig = field(default_factory=PoprtConfig)
    onnxruntime: OrtConfig = field(default_factory=OrtConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    target_name: str = "ipu-mk2"
    custom_targets: Mapping[str, Target] = field(default_factory=dict)
    source: Path | None = None
    plan_given: frozenset[str] = frozenset()
    """The ``[plan]`` keys someone gave (the file, a flag, a sidecar, an API argument); the others
    are defaults, and a model dim filled from a default is a report warning."""

    def target(self, name: str | None = None) -> Target:
        """Resolve a target by name: custom targets shadow built-ins."""
        key = name or self.target_name
        if key in self.custom_targets:
            return self.custom_targets[key]
        if key in BUILTIN_TARGETS:
            return BUILTIN_TARGETS[key]
        known = ", ".join(sorted({*BUILTIN_TARGETS, *self.custom_targets}))
        raise ConfigError(f"unknown target {key!r}; known targets: {known}")


SECTIONS: dict[str, type] = {
    "plan": PlanConfig,
    "search": SearchConfig,
    "poprt": PoprtConfig,
    "onnxruntime": OrtConfig,
    "daemon": DaemonConfig,
    "cluster": ClusterConfig,
}
"""The ``[section]`` tables of ``sharderd.toml`` (besides ``[target]`` and ``[targets.*]``), in order."""

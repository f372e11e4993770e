"""What can go wrong with an attempt on a cluster that is not the attempt's own outcome."""

from __future__ import annotations

from sharderd.errors import EXIT_BACKEND_UNAVAILABLE, ConfigError, SharderdError

__all__ = [
    "AttemptLostError",
    "ClusterLostError",
    "ClusterUnavailableError",
    "UnschedulableError",
]


class AttemptLostError(SharderdError):
    """The node or Ray worker running an attempt died: the daemon runs the job again (a new try,
    counted against ``max_attempts`` like a planning worker killed by a signal)."""

    reason = "attempt_lost"


class UnschedulableError(SharderdError):
    """No node of the cluster can hold the attempt's resources within ``schedule_timeout``."""

    reason = "unschedulable"


class ClusterUnavailableError(ConfigError):
    """``engine = "ray"`` but Ray is not installed or the cluster cannot be joined."""

    reason = "cluster_unavailable"


class ClusterLostError(SharderdError):
    """The Ray head stopped answering for ``[cluster] head_timeout``: the daemon stops (exit 4,
    which systemd's ``Restart=on-failure`` restarts); the jobs it held resume at the next start."""

    exit_code = EXIT_BACKEND_UNAVAILABLE
    reason = "cluster_lost"

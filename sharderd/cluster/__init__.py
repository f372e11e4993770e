"""Compile attempts on a Ray cluster: the daemon stays the one driver, attempts become Ray tasks.

``executor`` is the driver side (submit, cancel, verify, retry as a job-level crash), ``task`` runs on
a node (the unchanged ``run_attempt`` → ``run_process`` path), ``artifacts`` seals and checks what
crosses ``shared_dir``, ``sweeper`` kills attempt process groups whose Ray worker died.
Ray is imported by ``executor`` and ``task`` only (``sharderd[ray]``).
"""

"""Compile attempts on a Ray cluster: the daemon stays the one driver, attempts become Ray tasks.

``executor`` is the driver side (submit, cancel, retry as a job-level crash) with its helpers
``resources`` (what an attempt reserves, whether a node can hold it), ``staging`` (the attempt folder
copied into ``shared_dir``), ``results`` (lost, failed or accepted; the artifact verified),
``stderr_stream`` and ``ray_messages`` (Ray's output as log lines); ``task`` runs on a node (the
unchanged ``run_attempt`` → ``run_process`` path), ``artifacts`` seals and checks what crosses
``shared_dir``, ``sweeper`` kills attempt process groups whose Ray worker died.
Ray is imported by ``executor``, ``ray_messages`` and ``task`` only (``sharderd[ray]``).
"""

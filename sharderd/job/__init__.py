"""Orchestration shared by the CLI and the daemon: plan sessions, the proving search, one job."""

"""Backends prove a plan: compile (and optionally run) an annotated model in a subprocess."""

"""Turn a plan into files: annotated model, PopRT sharding config, per-stage models."""

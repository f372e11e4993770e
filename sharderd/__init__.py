"""sharderd: plan, annotate and prove pipeline sharding of ONNX models."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]

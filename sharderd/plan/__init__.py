"""Plan pipeline stages: orders, per-position costs, the exact min-max partitioner."""

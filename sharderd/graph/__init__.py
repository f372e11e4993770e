"""The model as the planner sees it: loading, validation and per-node costs."""

"""report.json (versioned schema) and report.md for people."""

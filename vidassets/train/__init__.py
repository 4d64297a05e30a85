"""Train-facing plain Python: snapshots, takedowns, lineage."""

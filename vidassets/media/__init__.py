"""Media code (no Dagster): sandboxed probe, packet index, the one analysis decode pass, clips."""

"""Ingest (no Dagster): drops and their completeness, inventory with provenance, exact duplicates,
eval carve-out."""

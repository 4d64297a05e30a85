"""Curation (no Dagster): clip score formulas and scoring, duplicate groups, selection recipes."""

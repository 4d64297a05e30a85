"""Dagster entry point: ``dagster dev -m vidassets.definitions``.

Settings (YAML + env, see ``vidassets.config``) are read once, when Definitions load.
"""

from vidassets.config import load_settings
from vidassets.graph import build_definitions

defs = build_definitions(load_settings())

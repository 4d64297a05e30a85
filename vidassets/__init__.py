"""vidassets: a bucket of raw video → training-ready data, as Dagster assets."""

__version__ = "0.1.0"

"""Helpers shared by the stage modules (Dagster side)."""

import pandas as pd
from dagster import MaterializeResult

from vidassets.derive.annotations import selected_in_order
from vidassets.media import partition as media_work


def selected_or_keep(tables, table: str, key: str) -> tuple[list[dict], pd.DataFrame, MaterializeResult | None]:
    """(this partition's selected clips, the table's previous rows, None), or, when nothing here is
    selected (yet), keep the previous rows as they are and return the result to report."""
    selected = selected_in_order(tables.read_or_empty("selection"), key)
    previous = tables.read_or_empty(table, key)
    if selected:
        return selected, previous, None
    rows = media_work.records(previous)
    tables.write(table, key, rows)
    return selected, previous, MaterializeResult(metadata={"rows_in": 0, "rows_out": len(rows), "model_calls": 0,
                                                           "frames_decoded": 0})

"""Declarative automation: the automation-condition sensor, RUNNING by default, so new partitions
and code-version (model/recipe) bumps flow downstream without manual runs."""

from dagster import AssetSelection, AutomationConditionSensorDefinition, DefaultSensorStatus


def automation_sensor(interval_seconds: int = 30) -> AutomationConditionSensorDefinition:
    return AutomationConditionSensorDefinition(
        "vidassets_automation",
        target=AssetSelection.all(),
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=interval_seconds,
        description="Evaluates every asset's automation condition: a drop's chain runs eagerly after its "
        "ingest (the global assets and the work on selected clips are requested by global_stages_sensor and "
        "selected_clips_sensor), and assets whose code version (model/recipe version) changed re-run.",
    )

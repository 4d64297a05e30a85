"""Declarative automation: the automation-condition sensor, RUNNING by default, so new partitions
and code-version (model/recipe) bumps flow downstream without manual runs."""

from dagster import AssetSelection, AutomationConditionSensorDefinition, DefaultSensorStatus


def automation_sensor(interval_seconds: int = 30) -> AutomationConditionSensorDefinition:
    return AutomationConditionSensorDefinition(
        "vidassets_automation",
        target=AssetSelection.all(),
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=interval_seconds,
        description="Evaluates every asset's automation condition: eager updates after upstream changes "
        "(the work on selected clips excepted: see selected_clips_sensor), and re-runs of assets whose code "
        "version (model/recipe version) changed.",
    )

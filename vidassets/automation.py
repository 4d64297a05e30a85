"""Declarative automation: the automation-condition sensor, RUNNING by default, so new partitions
and code-version (model/recipe) bumps flow downstream without manual runs."""

from dagster import AssetSelection, AutomationConditionSensorDefinition, DefaultSensorStatus

automation_sensor = AutomationConditionSensorDefinition(
    "vidassets_automation",
    target=AssetSelection.all(),
    default_status=DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=30,
    description="Evaluates every asset's automation condition: eager updates after upstream "
    "changes, and re-runs of assets whose code version (model/recipe version) changed.",
)

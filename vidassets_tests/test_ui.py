"""The Dagster UI in a real browser, and the sensor with the daemon: `dagster dev` on a small
bucket (own port, own process group); the bucket sensor adds the drop's partition and its ingest
run succeeds without a manual step; headless Chromium (Debian's) shows every stage asset on the
asset graph and the upstream stages on a downstream asset's lineage; a partition materialization
launched through the webserver's GraphQL API completes; screenshots are kept as artifacts."""

from __future__ import annotations

import json
import os
import shutil
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from vidassets_tests.conftest import REPO, SMALL_LATENTS_YAML, dagster_dev_server

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="Debian chromium + chromium-driver not installed")
ARTIFACTS = REPO / ".vidassets" / "test-artifacts"
STAGES = ["raw_inventory", "eval_split", "video_probe", "frame_index", "video_analysis", "clips", "clip_scores",
          "clip_embeddings", "dedup_groups", "decontamination", "selection", "eval_features", "annotations",
          "latents", "text_embeddings", "clip_ladder", "clip_audio", "dataset_snapshot"]



def _graphql(port: int, query: str, variables: dict | None = None) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", method="POST",
                                     data=json.dumps({"query": query, "variables": variables or {}}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        body = json.loads(response.read())
    assert "errors" not in body, body
    return body["data"]


def _wait(predicate, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}")


RUNS = """query { runsOrError { ... on Runs { results { runId status tags { key value } } } } }"""


@pytest.fixture(scope="module")
def dagster_dev(demo_bucket: Path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui")
    drop = tmp / "bucket/raw/licensed/drop-0001"
    drop.mkdir(parents=True)
    for name in ("carphone.mp4", "_provenance.json", "_SUCCESS"):
        shutil.copy(demo_bucket / "raw/licensed/drop-0001" / name, drop / name)
    home = tmp / "home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    config = tmp / "vidassets.yaml"
    config.write_text(yaml.safe_dump({"bucket": {"sensor_interval_seconds": 5}, "eval": {"fraction": 0.0},
                                      **SMALL_LATENTS_YAML}))
    env = {**os.environ, "DAGSTER_HOME": str(home), "VIDASSETS_CONFIG": str(config),
           "VIDASSETS_BUCKET": str(tmp / "bucket"), "VIDASSETS_STORE": str(tmp / "store"),
           "VIDASSETS_EVAL_VAULT": str(tmp / "vault")}
    try:
        with dagster_dev_server(tmp, env, tmp / "dagster-dev.log") as port:
            _wait(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5).status == 200, 180,
                  "the webserver")
            yield port, tmp
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp / "dagster-dev.log", ARTIFACTS / "dagster-dev.log")


def _dismiss_dialogs(driver) -> None:
    """Close the first-visit community dialog if it shows (it covers the page)."""
    from selenium.webdriver.common.by import By

    time.sleep(3)
    for button in driver.find_elements(By.XPATH, "//button[normalize-space()='Skip']"):
        if button.is_displayed():
            button.click()


def _partition_runs(port: int, partition: str) -> list[dict]:
    runs = _graphql(port, RUNS)["runsOrError"]["results"]
    return [r for r in runs if {"key": "dagster/partition", "value": partition} in r["tags"]]


def test_sensor_ingests_the_new_drop_without_manual_steps(dagster_dev) -> None:
    port, _ = dagster_dev
    runs = _wait(lambda: [r for r in _partition_runs(port, "licensed/drop-0001") if r["status"] == "SUCCESS"], 240,
                 "the sensor's ingest run")
    assert runs


def test_ui_shows_the_graph_and_lineage_and_launches_a_partition(dagster_dev) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    port, _ = dagster_dev
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1600,2400"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        driver.get(f"http://127.0.0.1:{port}/assets")  # the catalog lists every asset by name
        _dismiss_dialogs(driver)
        _wait(lambda: all(name in driver.page_source for name in STAGES), 120, "every stage in the asset catalog")
        driver.save_screenshot(str(ARTIFACTS / "asset-catalog.png"))
        driver.get(f"http://127.0.0.1:{port}/assets/clips?view=lineage&lineageScope=upstream&lineageDepth=10")
        _dismiss_dialogs(driver)
        upstream = ["video_analysis", "video_probe", "eval_split", "raw_inventory"]
        try:
            _wait(lambda: all(name in driver.page_source for name in upstream), 120, "clips' upstream lineage")
        finally:
            driver.save_screenshot(str(ARTIFACTS / "clips-lineage.png"))
    finally:
        driver.quit()
    # launch one partition of a stage through the webserver's GraphQL API, as the UI's button does
    _wait(lambda: [r for r in _partition_runs(port, "licensed/drop-0001") if r["status"] == "SUCCESS"], 240,
          "the ingest run")
    launched = _graphql(port, """
        mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
          __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }""",
        {"params": {"selector": {"repositoryLocationName": "vidassets.definitions", "repositoryName": "__repository__",
                                 "jobName": "__ASSET_JOB", "assetSelection": [{"path": ["video_probe"]}]},
                    "executionMetadata": {"tags": [{"key": "dagster/partition", "value": "licensed/drop-0001"}]}}})
    assert launched["launchRun"]["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["launchRun"]["run"]["runId"]
    status_query = "query($id: ID!) { runOrError(runId: $id) { ... on Run { status } } }"
    status = _wait(lambda: (s := _graphql(port, status_query, {"id": run_id})["runOrError"]["status"])
                   in ("SUCCESS", "FAILURE", "CANCELED") and s, 300, "the launched run")
    assert status == "SUCCESS"

"""The README's picture of the asset graph: ``dagster-webserver`` on the vidassets definitions
(an empty store: the graph is the same with or without data), its global lineage page in headless
Chromium with every group expanded, saved as ``docs/images/asset-graph.png``.

    .venv/bin/python docs/screenshot.py
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "images" / "asset-graph.png"


def _expand_groups(driver) -> None:
    """Every group open: the lineage graph's "Expand all groups" (its settings menu; shortcut Alt+E)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    groups_before = len(driver.find_elements(By.XPATH, "//*[name()='foreignObject']"))
    ActionChains(driver).key_down(Keys.ALT).send_keys("e").key_up(Keys.ALT).perform()
    time.sleep(6)
    if len(driver.find_elements(By.XPATH, "//*[name()='foreignObject']")) <= groups_before:
        raise RuntimeError("Alt+E did not expand the asset graph's groups")


def main() -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    tmp = Path(tempfile.mkdtemp(prefix="vidassets-shot-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DAGSTER_HOME": str(tmp), "VIDASSETS_BUCKET": str(tmp / "bucket"),
           "VIDASSETS_STORE": str(tmp / "store"), "VIDASSETS_EVAL_VAULT": str(tmp / "vault")}
    (tmp / "bucket").mkdir()
    server = subprocess.Popen([str(Path(sys.executable).parent / "dagster-webserver"), "-m", "vidassets.definitions",
                               "-p", str(port), "-h", "127.0.0.1"], cwd=tmp, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1800,1100", "--force-device-scale-factor=1"):
        options.add_argument(flag)
    driver = None
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5).status == 200:
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1)
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
        driver.get(f"http://127.0.0.1:{port}/asset-groups")
        time.sleep(8)
        for button in driver.find_elements(By.XPATH, "//button[normalize-space()='Skip']"):
            if button.is_displayed():
                button.click()
        time.sleep(2)
        _expand_groups(driver)
        OUT.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(OUT))
        from PIL import Image

        with Image.open(OUT) as shot:  # the graph only: no navigation, group list or zoom toolbar
            graph = shot.crop((540, 110, 1740, shot.height))
        graph.save(OUT, optimize=True)
        print(OUT)
    finally:
        if driver is not None:
            driver.quit()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

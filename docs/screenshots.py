"""Screenshots of the MLflow UI for docs/mlflow-ui.md, taken from a real study's store with headless Chromium.

cd SOMEWHERE && ablate sweep ablations/studies/quickstart.yaml && ablate report quickstart
python docs/screenshots.py SOMEWHERE/.ablate/mlflow.db quickstart
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(db: str, study: str) -> None:

    from mlflow import MlflowClient
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    from ablations.ui import lean_server_env, mlflow_server_command
    from tests.conftest import free_port, stop, wait_for_http

    uri = f"sqlite:///{Path(db).resolve()}"
    c = MlflowClient(uri)
    exp = c.get_experiment_by_name(study)
    parent = c.search_runs([exp.experiment_id], "tags.kind = 'study'", order_by=["attributes.start_time DESC"])[0]
    port = free_port()
    log = Path(db).resolve().parent / "logs" / "screenshots-mlflow.log"  # the server's access log, not the terminal
    log.parent.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        mlflow_server_command(uri, "127.0.0.1", port), env=lean_server_env(), start_new_session=True,
        stdout=log.open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    out = ROOT / "docs" / "img"
    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1500,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        server = f"http://127.0.0.1:{port}"
        wait_for_http(f"{server}/health", proc=proc)

        def shot(url: str, name: str, wait_for: str, click: str | None = None) -> None:
            driver.get(url)
            for _ in range(120):
                if wait_for in driver.find_element(By.TAG_NAME, "body").text:
                    break
                time.sleep(0.5)
            if click:
                for b in driver.find_elements(By.CSS_SELECTOR, click):
                    b.click()
                time.sleep(2)
            time.sleep(2)
            driver.save_screenshot(str(out / name))
            print("wrote", out / name)

        base = f"{server}/#/experiments/{exp.experiment_id}"
        shot(
            f"{base}/runs?workflowType=machine_learning",
            "runs.png",
            f"{study} #",
            "button[data-component-id*='runnamecellrenderer']",
        )
        shot(
            f"{base}/runs/{parent.info.run_id}/artifacts/report/report.html?workflowType=machine_learning",
            "report-in-mlflow.png",
            "report.html",
        )
        cell = c.search_runs([exp.experiment_id], "tags.kind = 'cell'")[0]
        shot(f"{base}/runs/{cell.info.run_id}?workflowType=machine_learning", "cell-run.png", "variant")
    finally:
        driver.quit()
        stop(proc)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

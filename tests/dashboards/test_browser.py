"""What a researcher sees: headless Chromium (driven through chromedriver) opens the MLflow UI of a finished
study and the HTML report artifact, served by a real ``mlflow server`` on 127.0.0.1, and the rendered pages
show the variants and their numbers. Screenshots land in the test's folder (docs/ holds ones from a real
study)."""

from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from dashboards.report import make_report
from record.runs import load_runs
from tests.conftest import mlflow_server
from tests.dashboards.test_report import three_variants

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
DRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None or DRIVER is None,
        reason="no Chromium and chromedriver on this machine (Debian: apt-get install "
        "chromium chromium-driver; `make test` installs them where it can)",
    ),
]


@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)  # no driver download
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for_text(driver, texts: list[str], timeout: float = 60) -> str:
    """The page's visible text once it shows every one of ``texts`` (single-page apps render late)."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        WebDriverWait(driver, timeout).until(
            lambda d: all(t in d.find_element(By.TAG_NAME, "body").text for t in texts)
        )
    except TimeoutException:
        body = driver.find_element(By.TAG_NAME, "body").text
        raise AssertionError(f"{driver.current_url} never showed {texts}; it shows:\n{body[:3000]}") from None
    return driver.find_element(By.TAG_NAME, "body").text


def test_mlflow_ui_and_the_report_show_the_variants_and_their_numbers(tmp_path, browser):
    uri = f"sqlite:///{tmp_path / 'server.db'}"  # the store the server below serves
    three_variants(uri)
    report = make_report(uri, "abl", out_dir=tmp_path / "report")
    rows = {r.variant: r for r in report.table.rows}
    runs = load_runs(uri, "abl")
    exp = runs.experiment_id
    with mlflow_server(tmp_path) as server:
        # MLflow's own UI: the study's runs, named by variant and seed
        # (workflowType: MLflow 3 opens on its GenAI pages) the submission's parent run, expanded to its cells
        browser.get(f"{server}/#/experiments/{exp}/runs?workflowType=machine_learning")
        wait_for_text(browser, ["abl #1"])
        for button in browser.find_elements("css selector", "button[data-component-id*='runnamecellrenderer']"):
            button.click()  # expand the parent run's children
        wait_for_text(browser, [f"{v} | seed 0" for v in rows])
        browser.save_screenshot(str(tmp_path / "runs.png"))

        # one run's page shows its metric and its tags
        run_id = runs.cells[runs.cells["variant"] == "better"].iloc[0]["run_id"]
        value = MlflowClient(uri).get_run(run_id).data.metrics["test/acc"]
        browser.get(f"{server}/#/experiments/{exp}/runs/{run_id}")
        wait_for_text(browser, ["test/acc", f"{value:.3f}"[:5], "better"])

        # the parent run lists the report among its artifacts
        browser.get(f"{server}/#/experiments/{exp}/runs/{report.parent_run_id}/artifacts")
        wait_for_text(browser, ["report"])
        browser.save_screenshot(str(tmp_path / "artifacts.png"))

        # the report, as the server serves the artifact, rendered: the table and the plots
        url = f"{server}/get-artifact?path=report/report.html&run_uuid={report.parent_run_id}"
        page = tmp_path / "served-report.html"
        with urllib.request.urlopen(url, timeout=60) as r:
            page.write_bytes(r.read())
        browser.get(page.as_uri())
        text = wait_for_text(browser, list(rows), timeout=30)
        for variant, row in rows.items():
            assert f"{row.summary.mean:.4g}" in text, variant
        assert "Verdicts" in text.split("Ablation table")[0]  # the verdicts come first
        images = browser.find_elements("css selector", "img")
        assert len(images) >= 2 and all(i.get_property("naturalWidth") > 100 for i in images)  # drawn at once
        browser.save_screenshot(str(tmp_path / "report.png"))
    assert Path(tmp_path / "report.png").stat().st_size > 10_000

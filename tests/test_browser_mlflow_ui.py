"""The MLflow UI in headless Chromium (Debian's chromium + chromium-driver, driven by Selenium) shows the
sweep's runs and a metric column; the screenshot is kept (KBSWEEP_SCREENSHOTS=DIR keeps a copy there too)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kbsweep.tracking.mlflow_store import make_client
from tests.test_tracking_server import served_sweep

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1800,1000",
)


@pytest.fixture(scope="module")
def served(request, tmp_path_factory):
    return served_sweep(request, tmp_path_factory)


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def test_mlflow_ui_shows_the_sweep_runs_and_a_metric_column(served, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as seen
    from selenium.webdriver.support.ui import WebDriverWait

    assert served["proc"].returncode == 0, served["proc"].stderr
    client = make_client(served["uri"])
    experiment = client.get_experiment_by_name(served["sweep"])
    [cell] = client.search_runs([experiment.experiment_id], "tags.`kbsweep.kind` = 'cell'")
    wait = WebDriverWait(browser, 90)
    screenshot = tmp_path / "mlflow_ui.png"
    try:
        browser.get(f"{served['uri']}/#/experiments/{experiment.experiment_id}/runs")
        name_cells = "//div[contains(@class,'ag-row')]//div[@col-id='attributes.`Run Name`']"
        expand = (
            f"{name_cells}[.//a[starts-with(normalize-space(.), 'sweep-')]]//button"  # the sweep run that has children
        )
        wait.until(seen.element_to_be_clickable((By.XPATH, expand))).click()
        wait.until(
            seen.visibility_of_element_located(
                (By.XPATH, f"{name_cells}//a[normalize-space(.)='{cell.info.run_name}']")
            )
        )
        wait.until(seen.element_to_be_clickable((By.XPATH, "//button[contains(., 'Columns')]"))).click()
        wait.until(seen.element_to_be_clickable((By.CSS_SELECTOR, "input[placeholder='Search columns']"))).send_keys(
            "score"
        )
        wait.until(
            seen.element_to_be_clickable((By.XPATH, "//*[contains(@class, 'tree-title')][normalize-space(.)='score']"))
        ).click()
        browser.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
        column = "[col-id='metrics.`score`']"
        wait.until(seen.presence_of_element_located((By.CSS_SELECTOR, f".ag-header-cell{column}")))
        scored = wait.until(
            lambda d: [
                c for c in d.find_elements(By.CSS_SELECTOR, f".ag-row {column}") if c.text.strip() not in ("", "-")
            ]
        )
        browser.execute_script("arguments[0].scrollIntoView({block: 'center', inline: 'center'})", scored[0])
        wait.until(
            lambda d: (
                d.find_element(By.CSS_SELECTOR, f".ag-header-cell{column}").is_displayed() and scored[0].is_displayed()
            )
        )
        values = [c.text for c in scored]
    finally:
        browser.save_screenshot(str(screenshot))
        if os.environ.get("KBSWEEP_SCREENSHOTS"):
            Path(os.environ["KBSWEEP_SCREENSHOTS"]).mkdir(parents=True, exist_ok=True)
            shutil.copy(screenshot, Path(os.environ["KBSWEEP_SCREENSHOTS"]) / screenshot.name)
    assert [float(v) for v in values] == pytest.approx([cell.data.metrics["score"]])
    assert screenshot.read_bytes().startswith(b"\x89PNG")


def test_mlflow_ui_shows_a_cell_trace_with_its_spans(served, browser, tmp_path):
    """The conversation viewer: the cell run's Traces tab lists its trace; opening it shows the model-turn and tool spans."""
    import mlflow
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as seen
    from selenium.webdriver.support.ui import WebDriverWait

    assert served["proc"].returncode == 0, served["proc"].stderr
    client = make_client(served["uri"])
    experiment = client.get_experiment_by_name(served["sweep"])
    [cell] = client.search_runs([experiment.experiment_id], "tags.`kbsweep.kind` = 'cell'")
    mlflow.set_tracking_uri(served["uri"])
    [trace] = mlflow.search_traces(locations=[experiment.experiment_id], run_id=cell.info.run_id, return_type="list")
    tool = next(s.name for s in trace.data.spans if s.span_type == "TOOL")
    wait = WebDriverWait(browser, 90)
    screenshot = tmp_path / "mlflow_trace.png"
    try:
        browser.get(f"{served['uri']}/#/experiments/{experiment.experiment_id}/runs/{cell.info.run_id}/traces")
        wait.until(
            seen.element_to_be_clickable((By.XPATH, f"//*[normalize-space(text())='{trace.info.trace_id}']"))
        ).click()
        for name in ("turn 1", tool):
            wait.until(seen.visibility_of_element_located((By.XPATH, f"//*[normalize-space(text())='{name}']")))
    finally:
        browser.save_screenshot(str(screenshot))
        (tmp_path / "mlflow_trace.html").write_text(browser.page_source)
        if os.environ.get("KBSWEEP_SCREENSHOTS"):
            Path(os.environ["KBSWEEP_SCREENSHOTS"]).mkdir(parents=True, exist_ok=True)
            shutil.copy(screenshot, Path(os.environ["KBSWEEP_SCREENSHOTS"]) / screenshot.name)


def test_the_printed_link_opens_the_runs_table_with_each_cells_columns(served, browser, tmp_path):
    """The address a sweep prints as it ends (`[kbsweep] runs of '<sweep>': …`) opens the model-training runs table,
    never MLflow's GenAI pages, with score, outcome, verdict, model, problem and cost as columns and the cell's run
    as a row of them (not folded under its sweep's run), each value the store's."""
    import re

    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    columns = (
        "metrics.`score`",
        "tags.`outcome`",
        "tags.`verdict`",
        "tags.`model`",
        "tags.`problem`",
        "metrics.`cost_usd`",
    )
    assert served["proc"].returncode == 0, served["proc"].stderr
    [link] = re.findall(rf"\[kbsweep\] runs of '{re.escape(served['sweep'])}': (\S+)", served["proc"].stderr)
    client = make_client(served["uri"])
    experiment = client.get_experiment_by_name(served["sweep"])
    [cell] = client.search_runs([experiment.experiment_id], "tags.`kbsweep.kind` = 'cell'")
    wait = WebDriverWait(
        browser, 90, ignored_exceptions=(StaleElementReferenceException,)
    )  # the grid re-renders as rows load
    screenshot = tmp_path / "mlflow_runs_link.png"
    try:
        browser.get(link)
        headers = lambda d: {h.get_attribute("col-id") for h in d.find_elements(By.CSS_SELECTOR, ".ag-header-cell")}  # noqa: E731
        wait.until(lambda d: set(columns) <= headers(d))
        cells = f".ag-center-cols-container .ag-row[row-id$='.{cell.info.run_id}'] .ag-cell"  # a row of its own, shown
        row = lambda d: {c.get_attribute("col-id"): c.text.strip() for c in d.find_elements(By.CSS_SELECTOR, cells)}  # noqa: E731
        shown = wait.until(
            lambda d: (lambda found: found if all(found.get(c) not in (None, "") for c in columns) else None)(row(d))
        )
        url, page = browser.current_url, browser.find_element(By.TAG_NAME, "body").text
    finally:
        browser.save_screenshot(str(screenshot))
        if os.environ.get("KBSWEEP_SCREENSHOTS"):
            Path(os.environ["KBSWEEP_SCREENSHOTS"]).mkdir(parents=True, exist_ok=True)
            shutil.copy(screenshot, Path(os.environ["KBSWEEP_SCREENSHOTS"]) / screenshot.name)
    assert f"/experiments/{experiment.experiment_id}/runs" in url and "workflowType=machine_learning" in url, url
    assert "Model training" in page and "matching runs" in page
    tags, metrics = cell.data.tags, cell.data.metrics
    for key in ("outcome", "verdict", "model", "problem"):
        assert shown[f"tags.`{key}`"] == tags[key], (key, shown)
    for key in ("score", "cost_usd"):
        assert float(shown[f"metrics.`{key}`"]) == pytest.approx(metrics[key], rel=1e-3), (key, shown)

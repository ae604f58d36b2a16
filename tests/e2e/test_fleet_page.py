"""The fleet page (issue 46) in a real browser: Debian's chromium, headless, driven by Selenium
through Debian's chromedriver, against the live core of the real control plane.

The fleet is the demo's nodes (an 8 x H100 NVSwitch box, 4 x A100 in NVLink pairs, 8 x L40S on
PCIe, an A100 in MIG mode) plus an H100 whose agent reports a leftover process on GPUs 0-2. A TP=8
engine holds the H100's whole NVLink island; a TP=8 70B engine that no node can hold waits. The
page must show the dirty GPU and the held island as such, the waiting pod with its reason, its
decision record on a click, and a cordon within a few seconds of ``gpusched cordon``. The test
writes a screenshot (``$GPUSCHED_ARTIFACTS/fleet-page.png``, else the test's tmp folder).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from devcluster.cluster import create_pod, pod_node, pod_scheduled_message, unique, vllm_pod, wait_until
from devcluster.controlplane import ControlPlane
from devcluster.fleet import create_preset_node
from devcluster.stack import Stack

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    """Headless chromium; fails loudly (make test installs both: hack/real-node-deps.sh) when missing."""
    for path in (CHROMIUM, CHROMEDRIVER):
        assert shutil.which(path), f"{path} is missing: install Debian's chromium and chromium-driver (make prepare does)"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1600,1200",
                f"--user-data-dir={tmp_path / 'chromium'}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log")))
    yield driver
    driver.quit()


def shown(driver: WebDriver, css: str, timeout: float = 20.0, what: str = "") -> object:
    """The first element matching ``css`` once the page shows one."""
    return WebDriverWait(driver, timeout).until(lambda d: (found := d.find_elements(By.CSS_SELECTOR, css)) and found[0],
                                                 message=f"the page never showed {what or css}")


def test_the_fleet_page_shows_the_fleet_pending_pods_their_decisions_and_a_cordon(
        admin, namespace, stack: Stack, control_plane: ControlPlane, agent_fleet, browser: WebDriver, tmp_path,
        request: pytest.FixtureRequest):
    token = unique("page")
    fleet_id = agent_fleet.fleet_id
    presets = [f"{token}-{preset}" for preset in ("h100", "a100", "l40s", "mig")]
    for name in presets:
        create_preset_node(admin, name, name.rsplit("-", 1)[1], labels={"gpusched.io/test-fleet": fleet_id})
        request.addfinalizer(lambda name=name: client.CoreV1Api(admin).delete_node(name))
    dirty = agent_fleet(3, name=f"{token}-dirty")  # GPUs 0-2 hold a leftover process's memory
    for name in presets:
        wait_until(lambda name=name: bool(stack.extender.node_view(name)), 30, f"the core to know {name}")

    island = vllm_pod("island", gpus=8, args=["--tensor-parallel-size", "8"])
    island["spec"]["nodeSelector"] = {"kubernetes.io/hostname": f"{token}-h100"}
    create_pod(admin, namespace, island)
    wait_until(lambda: pod_node(admin, namespace, "island"), 60, "the TP=8 engine to bind",
               context=lambda: pod_scheduled_message(admin, namespace, "island"))
    waiting = vllm_pod("waits", gpus=8, model="meta-llama/Llama-3.1-70B-Instruct", args=["--tensor-parallel-size", "8"],
                       annotations={"gpusched.io/gpu-memory-per-gpu": "60Gi"})
    waiting["spec"]["nodeSelector"] = {"gpusched.io/test-fleet": fleet_id}
    create_pod(admin, namespace, waiting)
    reason = wait_until(lambda: (stack.extender.get_json(f"/debug/decisions/{namespace}/waits").get("decisions", {})
                                 .get("filter") or {}).get("summary"), 30, "the waiting pod's filter record")

    browser.get(f"{stack.extender.base}/fleet")
    shown(browser, "#summary b", what="the summary")
    name_filter = browser.find_element(By.ID, "filter-name")
    name_filter.send_keys(token)
    for preset in ("h100", "a100", "l40s", "mig", "dirty"):
        shown(browser, f'article.node[data-node="{token}-{preset}"]', what=f"the node card of {token}-{preset}")
    # The filter applies on input, after a render: until then every node of the cluster shows (CI
    # once counted 7, two nodes of other tests still there).
    wait_until(lambda: len(browser.find_elements(By.CSS_SELECTOR, "article.node")) == 5, 10,
               f"the name filter to leave the 5 nodes of {token}",
               context=lambda: str(len(browser.find_elements(By.CSS_SELECTOR, "article.node"))))

    cell = shown(browser, f'.gpu[data-node="{dirty}"][data-gpu="2"]')
    assert cell.get_attribute("data-state") == "dirty" and "state-dirty" in cell.get_attribute("class")
    assert "foreign processes hold 68.4 GiB" in cell.get_attribute("title")
    held = shown(browser, f'.island[data-node="{token}-h100"]')
    assert held.get_attribute("data-state") == "held" and "island-held" in held.get_attribute("class"), held.text
    assert f"{namespace}/island" in shown(browser, f'.gpu[data-node="{token}-h100"][data-gpu="0"]').get_attribute("title")

    row = shown(browser, f'#pending tr[data-pod="{namespace}/waits"]', what="the waiting pod in the pending table")
    assert reason in row.text, (reason, row.text)
    row.find_element(By.CSS_SELECTOR, "button.pod").click()
    decision = shown(browser, "#decision-body h4", what="the decision record")
    body = browser.find_element(By.ID, "decision-body").text
    assert decision.text.startswith("filter: ") and reason in body, body

    admin_config = control_plane.kubeconfig(control_plane.admin_token, "admin")
    started = time.monotonic()
    stack.cli("cordon", f"{token}-l40s", "5", "--reason", "page test", "--kubeconfig", str(admin_config))
    WebDriverWait(browser, 10).until(
        lambda d: d.find_element(By.CSS_SELECTOR, f'.gpu[data-node="{token}-l40s"][data-gpu="5"]')
        .get_attribute("data-state") == "cordoned", message="the cordon never appeared within 10 s")
    appeared_s = time.monotonic() - started
    cordoned = browser.find_element(By.CSS_SELECTOR, f'.gpu[data-node="{token}-l40s"][data-gpu="5"]')
    assert "cordoned by an operator: page test" in cordoned.get_attribute("title")

    # The simulate form: YAML parsed in the browser, judged by the core, reserving nothing.
    browser.find_element(By.ID, "simulate-input").send_keys(
        "kind: Pod\nmetadata: {name: probe}\nspec:\n  nodeSelector: {kubernetes.io/hostname: " + token + "-l40s}\n"
        "  containers:\n  - name: e\n    image: x\n    resources: {limits: {nvidia.com/gpu: 2}}\n")
    browser.find_element(By.CSS_SELECTOR, "#simulate-form button").click()
    verdict = shown(browser, '#simulate-result tr[data-pod="default/probe"]', what="the simulated pod")
    assert "fits" in verdict.text and f"{token}-l40s" in verdict.text, verdict.text

    folder = Path(os.environ.get("GPUSCHED_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    screenshot = folder / "fleet-page.png"
    browser.execute_script("window.scrollTo(0, 0)")
    assert browser.save_screenshot(str(screenshot)) and screenshot.stat().st_size > 20_000
    print(f"fleet page screenshot: {screenshot}; the cordon appeared after {appeared_s:.1f} s")


"""Fixtures of the trajectory-record tests: verl's config for the agent loops, a real BM25 retriever and a
headless Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


@pytest.fixture(scope="session")
def trainer_config(make_trainer_config):
    """verl's config with the response length (4096) these tests were written for."""
    return make_trainer_config(response_length=4096)


def chromium_paths() -> tuple[str, str]:
    """Debian's `chromium` and `chromium-driver`; installed with apt-get where missing (CI runs as root)."""
    found = shutil.which("chromium"), shutil.which("chromedriver")
    if all(found):
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.fail("the page tests need Chromium: sudo apt-get install chromium chromium-driver")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=600"]
    subprocess.run([*apt, "update"], env=env, check=True, capture_output=True)
    install = [*apt, "install", "-y", "--no-install-recommends", "chromium", "chromium-driver"]
    subprocess.run(install, env=env, check=True, capture_output=True)
    return shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture(scope="session")
def browser():
    """Headless Chromium driven by Selenium, as a person's browser would open the page."""
    from selenium import webdriver

    binary, driver_path = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,1800",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
async def played_steps(tokenizer, trainer_config, retriever_url):
    """{step: records} of two training steps of `scripted_runs.PLAYED`, played by the real agent loops."""
    from scripted_runs import played_records

    return {step: await played_records(tokenizer, trainer_config, retriever_url, step) for step in (1, 2)}

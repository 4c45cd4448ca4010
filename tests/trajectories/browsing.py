"""Driving the page in the browser as a person would: open it, wait for a step, pick from a menu."""

from __future__ import annotations

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait


def wait_ready(browser, group: str) -> None:
    """Until the page has inflated and drawn step `group` (it then sets body[data-ready])."""
    WebDriverWait(browser, 30).until(lambda b: b.execute_script("return document.body.dataset.ready") == group)


def open_page(browser, path):
    """Open the file and wait for its first step; returns `find(css) -> elements`."""
    browser.get(f"file://{path}")
    wait_ready(browser, "g0")
    return lambda css: browser.find_elements(By.CSS_SELECTOR, css)


def choose(browser, element_id: str, value: str) -> None:
    Select(browser.find_element(By.ID, element_id)).select_by_value(value)

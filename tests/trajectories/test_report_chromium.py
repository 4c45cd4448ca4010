"""`verl-memagent show` writes a page that a browser renders as promised: headless Chromium opens it,
a screenshot is taken, and the DOM is read and driven like a person would (steps, filters, pages)."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from browsing import choose, open_page, wait_ready
from scripted_runs import PLAYED

from verl_memagent.trajectories.files import records_path, write_records


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, played_steps):
    """A run's record files: two training steps of the played trajectories."""
    directory = tmp_path_factory.mktemp("run") / "trajectories"
    for step, records in played_steps.items():
        write_records(records_path(directory, "train", step), records)
    return directory.parent


def show(*args: str) -> str:
    command = [sys.executable, "-m", "verl_memagent.cli", "show", *args]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def test_page_shows_turn_cards_plot_and_filters(run_dir, browser, tmp_path):
    from PIL import Image
    from selenium.webdriver.common.by import By

    out = tmp_path / "report.html"
    assert show(str(run_dir), "--out", str(out)) == str(out)
    html = out.read_text()
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html  # nothing fetched
    find = open_page(browser, out)

    shot = Image.open(io.BytesIO(browser.get_screenshot_as_png()))
    (tmp_path / "report.png").write_bytes(browser.get_screenshot_as_png())
    assert shot.size[0] >= 1000 and len(shot.convert("RGB").getcolors(1 << 20)) > 100  # drawn, not blank

    assert [o.text for o in find("#step option")] == ["train step 1 (5)", "train step 2 (5)"]
    assert browser.find_element(By.ID, "count").text == "5 of 5 trajectories"
    cards = find(".trajectory")
    assert len(cards) == len(PLAYED)
    # the first trajectory is open: its three turn cards, memory changes highlighted, passages listed
    turns = cards[0].find_elements(By.CSS_SELECTOR, ".turn")
    assert len(turns) == 3 and [t.get_attribute("data-turn") for t in turns] == ["0", "1", "2"]
    assert turns[0].find_elements(By.CSS_SELECTOR, "ins") and turns[1].find_elements(By.CSS_SELECTOR, "del")
    assert "Leerort lies on the Leda" in turns[0].find_element(By.CSS_SELECTOR, ".memory-pair").text
    assert len(turns[0].find_elements(By.CSS_SELECTOR, ".passages li")) == 10
    assert turns[2].find_element(By.CSS_SELECTOR, ".answer").text == "answer: between the 8th and 16th centuries"
    assert all(not card.find_elements(By.CSS_SELECTOR, ".turn") for card in cards[1:])  # rendered when opened
    cards[3].find_element(By.CSS_SELECTOR, ".summary").click()
    assert len(cards[3].find_elements(By.CSS_SELECTOR, ".turn")) == 3  # react: one per generate call
    # a context is put in the DOM only when its details are opened
    details = turns[0].find_element(By.CSS_SELECTOR, "details.context")
    assert details.find_element(By.TAG_NAME, "pre").get_attribute("textContent") == ""
    details.find_element(By.TAG_NAME, "summary").click()
    assert "<|im_start|>" in details.find_element(By.TAG_NAME, "pre").get_attribute("textContent")

    # the plot: a line per trajectory and a mean per agent, memsearcher flat, react growing
    assert len(find("#plot-svg .trajectory-line")) == len(PLAYED) and len(find("#plot-svg .mean-line")) == 2
    assert "memsearcher mean" in browser.find_element(By.ID, "plot-legend").text

    choose(browser, "filter-finish", "bad_format")
    assert browser.find_element(By.ID, "count").text == "1 of 5 trajectories"
    assert [c.get_attribute("data-finish") for c in find(".trajectory")] == ["bad_format"]
    assert len(find("#plot-svg .trajectory-line")) == 1
    choose(browser, "filter-finish", "")
    choose(browser, "filter-source", "leda_react")
    assert {c.get_attribute("data-source") for c in find(".trajectory")} == {"leda_react"} and len(
        find(".trajectory")
    ) == 2
    choose(browser, "filter-source", "")
    browser.find_element(By.ID, "filter-reward-min").send_keys("0.5")
    assert browser.find_element(By.ID, "count").text == "4 of 5 trajectories"
    assert all(float(c.get_attribute("data-reward")) >= 0.5 for c in find(".trajectory"))
    browser.find_element(By.ID, "step-next").click()
    wait_ready(browser, "g1")
    assert browser.find_element(By.ID, "step").get_attribute("value") == "1"
    assert browser.find_element(By.ID, "count").text == "4 of 5 trajectories"  # filters stay across steps


def test_steps_option_keeps_the_first_and_last_step(run_dir, browser, tmp_path):
    out = tmp_path / "report.html"
    show(str(run_dir / "trajectories"), "--out", str(out), "--steps", "last")
    find = open_page(browser, out)
    assert [o.text for o in find("#step option")] == ["train step 2 (5)"]


def test_a_large_step_is_paged_and_rendered_lazily(run_dir, browser, tmp_path):
    from selenium.webdriver.common.by import By

    from verl_memagent.trajectories.files import read_records

    played = read_records(records_path(run_dir / "trajectories", "train", 1))
    many = [
        record.model_copy(update={"trajectory_id": f"{record.trajectory_id}-{copy}"})
        for copy in range(400)
        for record in played
    ]
    write_records(tmp_path / "trajectories" / "step_7.jsonl", many)
    out = tmp_path / "report.html"
    show(str(tmp_path), "--out", str(out))
    find = open_page(browser, out)

    assert browser.find_element(By.ID, "count").text == "2000 of 2000 trajectories"
    assert len(find(".trajectory")) == 20 and browser.find_element(By.ID, "page-label").text == "page 1 of 100"
    assert len(find(".turn")) == len(played[0].turns)  # only the open trajectory's turn cards exist
    browser.find_element(By.ID, "page-next").click()
    assert browser.find_element(By.ID, "page-label").text == "page 2 of 100"
    assert find(".trajectory .num")[0].text == "#21"
    assert len(find("#plot-svg .trajectory-line")) == 400  # the plot draws a bounded number of lines

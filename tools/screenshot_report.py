"""Open the HTML report in headless Chromium, offline, and save a full-page screenshot.

    python tools/screenshot_report.py results/report/report.html results/report/report.png
    python tools/screenshot_report.py report.html shots/ --section answers parallelism

With --section, saves one picture per section (by its id, at 1,400 px as the reader's test
reads the page) into the folder given instead of the full page.

Prints the page height and every browser console message; exits 1 when the console logged an
error or the page did not render. Needs Debian's `chromium` and `chromium-driver`, and selenium
(envs/requirements-test.txt).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

WIDTH = 1280


def open_browser(chromedriver: str) -> webdriver.Chrome:
    options = webdriver.ChromeOptions()
    flags = [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        f"--window-size={WIDTH},1000",
    ]
    # No network: every request leaves through a proxy that does not exist, so the report
    # must render from the file alone.
    flags += ["--proxy-server=http://127.0.0.1:9", "--proxy-bypass-list=<-loopback>"]
    for flag in flags:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(chromedriver))


def screenshot(html: Path, png: Path, chromedriver: str = "/usr/bin/chromedriver") -> dict:
    """Render `html` from file://, save `png`, return what the page looked like."""
    driver = open_browser(chromedriver)
    try:
        driver.get(Path(html).resolve().as_uri())
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(WIDTH, min(height, 16000))
        facts = driver.execute_script(
            """return {
                title: document.title,
                sections: [...document.querySelectorAll('section')].map(s => s.id),
                images: document.images.length,
                broken_images: [...document.images]
                    .filter(i => !i.complete || !i.naturalWidth).length,
            }"""
        )
        png.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(png))
        console = driver.get_log("browser")
    finally:
        driver.quit()
    return facts | {"height": height, "console": console, "screenshot": str(png)}


def sections(
    html: Path,
    folder: Path,
    ids: list[str],
    width: int = 1400,
    chromedriver: str = "/usr/bin/chromedriver",
) -> dict[str, str]:
    """One PNG per section id, as it shows at `width` px (collapsed parts collapsed)."""
    driver = open_browser(chromedriver)
    saved = {}
    try:
        driver.get(Path(html).resolve().as_uri())
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(width, min(height, 16000))
        folder.mkdir(parents=True, exist_ok=True)
        for section_id in ids:
            png = folder / f"screenshot-{section_id}.png"
            driver.find_element(By.ID, section_id).screenshot(str(png))
            saved[section_id] = str(png)
    finally:
        driver.quit()
    return saved


def filter_all_runs(
    html: Path, filters: dict[str, str], chromedriver: str = "/usr/bin/chromedriver"
) -> dict:
    """Type `filters` ({column header: text}) into the all-runs table's filter boxes, as a
    reader would; return the runs left shown ([study, run, status] each), the line under the
    table, and what clearing the boxes shows again."""

    driver = open_browser(chromedriver)
    try:
        driver.get(Path(html).resolve().as_uri())
        driver.find_element(By.CSS_SELECTOR, "#all-runs-details > summary").click()  # open it
        sortable = driver.find_elements(By.CSS_SELECTOR, "#all-runs-table th.sortable")
        headers = [th.text.replace("↕", "").strip() for th in sortable]
        boxes = driver.find_elements(By.CSS_SELECTOR, "#all-runs-table tr.filters input")
        for header, text in filters.items():
            boxes[headers.index(header)].send_keys(text)
        visible = driver.execute_script(
            """return [...document.querySelectorAll('#all-runs-table tbody tr')]
                .filter(r => !r.hidden)
                .map(r => [...r.cells].slice(0, 3).map(c => c.textContent.trim()));"""
        )
        shown = driver.find_element(By.ID, "all-runs-shown").text
        for box in boxes:
            box.clear()
            box.send_keys(" ")  # an input event; blank filters pass every row
        rows = driver.execute_script(
            "return [...document.querySelectorAll('#all-runs-table tbody tr')]"
            ".filter(r => !r.hidden).length"
        )
    finally:
        driver.quit()
    return {"visible": visible, "shown": shown, "after_clearing": rows}


def reading(html: Path, width: int = 1400, chromedriver: str = "/usr/bin/chromedriver") -> dict:
    """What a reader meets at `width` px: the visible words (innerText: what is not collapsed),
    each Answers entry (section id, its whole text, the sentences after the first collapsed
    included), the key tables wider than their section, whether a
    link to each section opens on it, and the page printed to A4 PDF (Chromium's print-to-PDF
    under the print stylesheet): its pages, its text, and each key table's column headers."""
    import base64
    import io

    import pypdf

    driver = open_browser(chromedriver)
    try:
        driver.set_window_size(width, 1000)
        uri = Path(html).resolve().as_uri()
        driver.get(uri)
        facts = driver.execute_script(
            """const norm = (t) => t.replace(/\\s+/g, ' ').trim();
            return {
                words: document.body.innerText.split(/\\s+/).filter(Boolean).length,
                answers: [...document.querySelectorAll('#answers dt')].map(dt => [
                    dt.querySelector('a').getAttribute('href').slice(1),
                    norm(dt.nextElementSibling.textContent)]),
                wide_key_tables: [...document.querySelectorAll('.table-wrap.key')]
                    .filter(w => w.scrollWidth > w.clientWidth + 1)
                    .map(w => w.closest('section').id),
                key_headers: [...document.querySelectorAll('.table-wrap.key table')]
                    .map(t => [...t.rows[0].cells].map(c => norm(c.textContent))),
                sections: [...document.querySelectorAll('section')].map(s => s.id),
            }"""
        )
        opens_on = {}
        for section in facts["sections"]:
            driver.get(f"{uri}#{section}")
            # On its heading, or, for a section near the end that can't scroll to the top, in
            # view with the page scrolled to its end.
            opens_on[section] = driver.execute_script(
                """const r = document.getElementById(arguments[0]).getBoundingClientRect();
                const end = window.scrollY + window.innerHeight
                    >= document.documentElement.scrollHeight - 2;
                return (r.top >= -2 && r.top < 40) || (end && r.top < window.innerHeight);""",
                section,
            )
        pdf = driver.execute_cdp_cmd(
            "Page.printToPDF", {"paperWidth": 8.27, "paperHeight": 11.69, "printBackground": False}
        )
    finally:
        driver.quit()
    document = pypdf.PdfReader(io.BytesIO(base64.b64decode(pdf["data"])))
    text = " ".join(page.extract_text() for page in document.pages)
    return facts | {
        "opens_on_section": opens_on,
        "pdf_pages": len(document.pages),
        "pdf_text": " ".join(text.split()),
    }


def wide_tables(html: Path, width: int = 1400, chromedriver: str = "/usr/bin/chromedriver") -> dict:
    """The page's computed body font and, at `width` px, the tables wider than the box that
    holds them (each as its section's id and the overflow in px)."""
    driver = open_browser(chromedriver)
    try:
        driver.set_window_size(width, 1000)
        driver.get(Path(html).resolve().as_uri())
        return driver.execute_script(
            """return {
                font: getComputedStyle(document.body).fontFamily,
                wide: [...document.querySelectorAll('.table-wrap')]
                    .filter(w => w.scrollWidth > w.clientWidth + 1)
                    .map(w => [(w.closest('section') || {}).id, w.scrollWidth - w.clientWidth]),
            }"""
        )
    finally:
        driver.quit()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    parser.add_argument("--section", nargs="+", help="section ids: one picture each")
    args = parser.parse_args()
    if args.section:
        saved = sections(args.html, args.png, args.section, chromedriver=args.chromedriver)
        print(json.dumps(saved, indent=2))
        return 0
    facts = screenshot(args.html, args.png, args.chromedriver)
    print(json.dumps(facts, indent=2))
    errors = [m for m in facts["console"] if m["level"] == "SEVERE"]
    return 1 if errors or facts["broken_images"] or not facts["sections"] else 0


if __name__ == "__main__":
    sys.exit(main())

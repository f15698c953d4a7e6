"""Real-browser tests: Playwright drives Debian's Chromium against a live evalsite server.

Runs execute inline (Celery eager) inside the live server, so a test sees a run finish without
a worker process; everything else is the real stack. Screenshots land in artifacts/screenshots/.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# Playwright's sync API runs an event loop in this thread; the test's own ORM calls are still
# plain synchronous code, so Django's async guard must not stop them.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


@pytest.fixture(autouse=True)
def _eager(settings):
    from evalsite.celery import app

    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip("Chromium is not installed (./test.sh installs Debian's chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(
        viewport={"width": 1400, "height": 1000}, base_url=live_server.url
    )
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("response", lambda response: _record_failure(response, errors))
    yield page
    context.close()
    assert not errors, f"the browser reported errors: {errors}"


def _record_failure(response, errors: list[str]) -> None:
    if response.status >= 400 and not response.url.endswith("/favicon.ico"):
        errors.append(f"{response.status} {response.url}")


@pytest.fixture
def shoot():
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def shoot(page, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return shoot


@pytest.fixture
def logged_in(page, owner, project):
    page.goto("/login/")
    page.fill("#id_username", "alice")
    page.fill("#id_password", "pw-alice-123")
    page.click("button[type=submit]")
    page.wait_for_url("**/p/acme/")
    return page

"""A new renter's first visit, in a real browser: Playwright driving Debian's Chromium
(headless) against the whole platform as real processes (tests/fixtures/platform.py).

Two people: Olga signs up, confirms her address from the mail, creates an organisation
and invites Ivan, who signs up through the invitation, confirms, and joins. Olga then
launches a batch job from the launch form and reads its output on the job's page (the
websocket tail), launches a shell session on a simulated GPU, sees it run, uses its
terminal, and stops it.

Mail goes to files (Django's file backend, in a temporary folder), not to the console as
the issue put it: the console backend prints each message into the web process's output,
mixed with its log, where a test would have to cut it out again; the file backend writes
the same text (the same message, as the console would print it) to files of its own, so
the test reads the confirmation and invitation links there, as a person reads their
inbox. Each step is a function of its own; when one fails, every open page is saved as a
screenshot to a temporary folder that the failure names.

In the session, she types `echo hello` into the web terminal (xterm.js, the portal's
websocket, a PTY in the job's sandbox on the agent) and sees the shell answer `hello`.

Last, on a phone's screen (390 × 844), each main page (dashboard, jobs, the job, launch,
organisation, account, billing, the session) scrolls no wider than the screen, and every
form control on it has a label (checked in the page itself).
"""

from __future__ import annotations

import email
import re
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import Message
from pathlib import Path

import pytest
from playwright import sync_api

from tests.fixtures.platform import Platform, start_platform
from tests.fixtures.processes import wait_until

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")  # Debian's (apt-get install chromium); .ci/run installs it
PASSWORD = "a long passphrase 42"
# Playwright's waits, in milliseconds: a page; and what the scheduler must do first (place
# the job, the agent start it, the output come back over the websocket).
PAGE_MS = 15_000
JOB_MS = 45_000

expect = sync_api.expect


@pytest.fixture(scope="module")
def mail_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="spur-mail-") as folder:
        yield Path(folder)


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory, mail_dir: Path) -> Iterator[Platform]:
    yield from start_platform(
        tmp_path_factory.mktemp("platform"),
        extra_env={
            "EMAIL_BACKEND": "django.core.mail.backends.filebased.EmailBackend",
            "EMAIL_FILE_PATH": str(mail_dir),
            "SIGNUP_MODE": "verified",  # confirmation by mail, as production's default
            # Rate limits of its own (allauth sends one confirmation per address every
            # few minutes): a run right after another signs up the same people.
            "CACHE_KEY_PREFIX": f"browser-test-{secrets.token_hex(4)}",
        },
    )


@pytest.fixture
def browser() -> Iterator[sync_api.Browser]:
    # Missing, it fails (not skips): .ci/run installs it, and a skipped check hides a gap.
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install chromium"
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


class Screenshots:
    """Saves every open page when a step fails, and says where."""

    def __init__(self, browser: sync_api.Browser) -> None:
        self.browser = browser

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            folder = Path(tempfile.mkdtemp(prefix="spur-browser-"))
            for i, context in enumerate(self.browser.contexts):
                for j, page in enumerate(context.pages):
                    try:
                        page.screenshot(path=str(folder / f"{name}-{i}-{j}.png"), full_page=True)
                        (folder / f"{name}-{i}-{j}.html").write_text(page.content())
                    except Exception as shot:  # a crashed page: say so, keep the rest
                        (folder / f"{name}-{i}-{j}.error").write_text(repr(shot))
            raise AssertionError(f"step {name!r} failed; screenshots in {folder}") from exc


# -- the mailbox --------------------------------------------------------------------------


def _messages(mail_dir: Path) -> list[Message]:
    """Every message the file backend wrote: one file per connection, messages in it
    separated by a line of 79 dashes."""
    out = []
    for path in sorted(mail_dir.iterdir()):
        for chunk in path.read_text(errors="replace").split("\n" + "-" * 79 + "\n"):
            if chunk.strip():
                out.append(email.message_from_string(chunk))
    return out


def _text(message: Message) -> str:
    parts = []
    for part in message.walk():
        if part.get_content_type() == "text/plain":
            payload = part.get_payload(decode=True)
            if isinstance(payload, bytes):
                parts.append(payload.decode(part.get_content_charset() or "utf-8"))
    return "\n".join(parts)


def mailed_link(mail_dir: Path, to: str, path: str) -> str:
    """The newest link under `path` mailed to `to` (waiting for the mail to arrive)."""
    found: list[str] = []

    def arrived() -> bool:
        for message in _messages(mail_dir):
            if to in str(message.get("To", "")):
                found.extend(re.findall(rf"https?://\S+{re.escape(path)}\S*", _text(message)))
        return bool(found)

    wait_until(arrived, timeout=20, what=f"a mail to {to} with a {path} link")
    return found[-1]


# -- the steps ----------------------------------------------------------------------------


def sign_up(page: sync_api.Page, platform: Platform, email_address: str) -> None:
    page.goto(f"{platform.web_url}/accounts/signup/")
    page.fill("#id_email", email_address)
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.get_by_role("button", name="Sign Up").click()
    expect(page).to_have_url(re.compile(r"/accounts/confirm-email/$"), timeout=PAGE_MS)


def confirm_email(page: sync_api.Page, mail_dir: Path, email_address: str) -> None:
    page.goto(mailed_link(mail_dir, email_address, "/accounts/confirm-email/"))
    page.get_by_role("button", name="Confirm").click()
    page.wait_for_load_state()
    if "/accounts/login/" in page.url:  # confirmed in another session: sign in
        page.fill("#id_login", email_address)
        page.fill("#id_password", PASSWORD)
        page.get_by_role("button", name="Sign In").click()
    expect(page.locator("header .who")).to_have_text(email_address, timeout=PAGE_MS)


def create_organization(page: sync_api.Page, platform: Platform, name: str) -> None:
    page.goto(f"{platform.web_url}/")
    expect(page).to_have_url(re.compile(r"/organizations/new$"), timeout=PAGE_MS)
    page.fill("#id_name", name)
    page.get_by_role("button", name="Create").click()
    expect(page.locator("#guide-title")).to_contain_text(f"Welcome to {name}", timeout=PAGE_MS)


def invite(page: sync_api.Page, platform: Platform, email_address: str) -> None:
    page.goto(f"{platform.web_url}/invitations/")
    page.fill("#id_email", email_address)
    page.select_option("#id_role", "member")
    page.get_by_role("button", name="Create invitation").click()
    expect(page.locator("#invitation-link")).to_contain_text("/invitations/accept/")


def accept_invitation(page: sync_api.Page, mail_dir: Path, email_address: str, org: str) -> None:
    """The invitee opens the mailed link, signs up with the address filled in, confirms
    it, and is in the organisation."""
    page.goto(mailed_link(mail_dir, email_address, "/invitations/accept/"))
    expect(page).to_have_url(re.compile(r"/accounts/signup/"), timeout=PAGE_MS)
    expect(page.locator("#id_email")).to_have_value(email_address)
    page.fill("#id_password1", PASSWORD)
    page.fill("#id_password2", PASSWORD)
    page.get_by_role("button", name="Sign Up").click()
    expect(page).to_have_url(re.compile(r"/accounts/confirm-email/$"), timeout=PAGE_MS)
    confirm_email(page, mail_dir, email_address)
    expect(page.locator("#active-title, #guide-title").first).to_contain_text(org)


def members_include(page: sync_api.Page, platform: Platform, email_address: str) -> None:
    page.goto(f"{platform.web_url}/organization/")
    expect(page.locator("main")).to_contain_text(email_address, timeout=PAGE_MS)


def launch_batch_job(page: sync_api.Page, platform: Platform) -> None:
    page.goto(f"{platform.web_url}/launch/")
    page.fill("#id_name", "browser-job")
    # The shell computes the number: the output is the job's, not the form's echo.
    page.fill("#id_command", "echo browser-says-$((6*7))")
    page.fill("#id_gpus", "1")
    page.locator("form.launch-form").first.get_by_role("button", name="Submit").click()
    expect(page).to_have_url(re.compile(r"/jobs/[0-9]+/$"), timeout=PAGE_MS)


def output_tail_shows(page: sync_api.Page) -> None:
    expect(page.locator("#output-stdout")).to_contain_text("browser-says-42", timeout=JOB_MS)
    expect(page.locator("#job-state")).to_have_text("COMPLETED", timeout=JOB_MS)


def launch_session(page: sync_api.Page, platform: Platform) -> None:
    page.goto(f"{platform.web_url}/launch/")
    page.select_option("#id_session-template", "shell")
    page.select_option("#id_session-gpu_type", "h100")
    page.fill("#id_session-gpus", "1")
    page.fill("#id_session-max_minutes", "10")
    page.get_by_role("button", name="Start session").click()
    expect(page).to_have_url(re.compile(r"/sessions/[0-9]+/$"), timeout=PAGE_MS)


def the_session_runs(page: sync_api.Page) -> None:
    # htmx keeps the phase current (the status fragment, every 3 s) without a reload.
    expect(page.locator("#session-phase")).to_have_text("running", timeout=JOB_MS)
    expect(page.locator("#session-status")).to_contain_text("sim02")  # the H100 node


def the_terminal_runs_a_command(page: sync_api.Page) -> None:
    # The page's terminal retries until the session runs, then holds a shell in it.
    expect(page.locator("#terminal-status")).to_contain_text("Connected", timeout=JOB_MS)
    page.locator("#terminal-screen").click()
    page.keyboard.type("echo hello\n")
    # A line that is `hello` alone: the shell's answer, not the echo of what was typed.
    answer = page.locator("#terminal-screen .xterm-rows > div").filter(
        has_text=re.compile(r"^\s*hello\s*$")
    )
    expect(answer.first).to_be_visible(timeout=JOB_MS)


def stopping_ends_the_session(page: sync_api.Page) -> None:
    page.get_by_role("button", name="Stop session").click()
    expect(page.locator("#session-phase")).to_have_text("ended", timeout=JOB_MS)


PHONE = {"width": 390, "height": 844}
# In the page: how wide it scrolls, and its form controls that no label names (a <label>,
# aria-label or aria-labelledby; a button by its text).
PAGE_CHECK = """() => {
  const unnamed = [];
  for (const el of document.querySelectorAll("input, select, textarea, button")) {
    if (el.type === "hidden") continue;
    const named = (el.labels && el.labels.length > 0) || el.getAttribute("aria-label") ||
      el.getAttribute("aria-labelledby") ||
      (el.tagName === "BUTTON" && el.textContent.trim());
    if (!named) unnamed.push(el.outerHTML.slice(0, 120));
  }
  return {width: document.scrollingElement.scrollWidth, unnamed: unnamed};
}"""


def fits_a_phone(page: sync_api.Page, platform: Platform, paths: list[str]) -> None:
    page.set_viewport_size(PHONE)
    problems = {}
    for path in paths:
        page.goto(f"{platform.web_url}{path}")
        page.wait_for_load_state("networkidle")
        found = page.evaluate(PAGE_CHECK)
        if found["width"] > PHONE["width"] or found["unnamed"]:
            problems[path] = found
    assert not problems, problems


# -- the visit ----------------------------------------------------------------------------


def test_a_new_renter_signs_up_invites_launches_and_runs_a_session(
    platform: Platform, mail_dir: Path, browser: sync_api.Browser
) -> None:
    shots = Screenshots(browser)
    olga = browser.new_context().new_page()
    ivan = browser.new_context().new_page()
    for page in (olga, ivan):
        page.set_default_timeout(PAGE_MS)

    with shots.step("sign-up"):
        sign_up(olga, platform, "olga@example.com")
    with shots.step("confirm-email"):
        confirm_email(olga, mail_dir, "olga@example.com")
    with shots.step("create-organisation"):
        create_organization(olga, platform, "Olga Labs")
    with shots.step("invite"):
        invite(olga, platform, "ivan@example.com")
    with shots.step("accept-invitation"):
        accept_invitation(ivan, mail_dir, "ivan@example.com", "Olga Labs")
        members_include(olga, platform, "ivan@example.com")
    with shots.step("batch-job"):
        launch_batch_job(olga, platform)
        job = olga.url.removeprefix(platform.web_url)
        output_tail_shows(olga)
    with shots.step("session"):
        launch_session(olga, platform)
        session = olga.url.removeprefix(platform.web_url)
        the_session_runs(olga)
    with shots.step("terminal"):
        the_terminal_runs_a_command(olga)
    with shots.step("stop-session"):
        stopping_ends_the_session(olga)
    with shots.step("phone-width"):
        pages = ["/", "/jobs/", job, "/launch/", "/organization/", "/account/", "/billing/"]
        fits_a_phone(olga, platform, [*pages, session])

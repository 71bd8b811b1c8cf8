"""The chat page in a real headless Chromium against a real mlx-serve (driven by
server/tests/web_page.rs): a scripted conversation, screenshots, the stop
button, tool calls, reloading, conversations, and the page's Markdown.

usage: python web_page.py BASE_URL API_KEY SCREENSHOT_DIR
Prints "web page: all checks passed" at the end; any failed check raises.
"""

import os
import shutil
import sys

from playwright.sync_api import expect, sync_playwright

base, key, shots = sys.argv[1], sys.argv[2], sys.argv[3]
os.makedirs(shots, exist_ok=True)


def chromium():
    for path in (os.environ.get("CHROMIUM"), shutil.which("chromium"), shutil.which("chromium-browser"),
                 shutil.which("google-chrome"), "/Applications/Google Chrome.app/Contents/MacOS/Google Chrome"):
        if path and os.path.exists(path):
            return path
    raise SystemExit("no Chromium found: run scripts/browser-env.sh (or set CHROMIUM)")


def setting(page, field, value):
    """Sets a settings field as a person would (the page saves on change)."""
    if page.locator(field).evaluate("e => e.tagName") == "SELECT":
        page.select_option(field, value)
    else:
        page.fill(field, value)
    page.dispatch_event(field, "change")


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok:", what)


# Flags for a sandboxed root CI machine with no network but loopback.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]

with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=chromium(), args=FLAGS)
    page = browser.new_page(viewport={"width": 1280, "height": 860})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(base + "/")
    expect(page.locator("#memory")).to_contain_text("API key")
    check(page.locator("#model-name").inner_text() == "mlx-serve", "without the key the page shows no details")

    # Without the key the API refuses, and the page says why.
    page.fill("#prompt", "hello?")
    page.press("#prompt", "Enter")
    expect(page.locator(".message.assistant .error")).to_contain_text("API key")
    print("ok: a refused request shows the API's error message")

    # The key, then a short greedy answer with a thinking template.
    setting(page, "#api-key", key)
    expect(page.locator("#model-name")).not_to_have_text("mlx-serve")
    expect(page.locator("#memory")).to_contain_text("memory")
    setting(page, "#temperature", "0")
    setting(page, "#max-tokens", "24")
    # Watch the prefill progress text from outside the page's own code: each
    # update replaces the text node, and the records keep every one (progress
    # and the first tokens may arrive in one read, shown and hidden in one task).
    page.evaluate("""() => {
        window.progressSeen = [];
        new MutationObserver((records) => {
            for (const r of records) for (const n of r.addedNodes) window.progressSeen.push(n.textContent);
        }).observe(document.querySelector('#progress-text'), {childList: true});
    }""")
    setting(page, "#system-prompt", "the model token server memory cache layer weight attention value key query " * 8)
    page.fill("#prompt", "Tell me about the weather")
    page.press("#prompt", "Enter")
    answer = page.locator(".message.assistant").last
    expect(answer.locator(".stats")).to_contain_text("tok/s", timeout=60_000)
    stats = answer.locator(".stats").inner_text()
    check("TTFT" in stats and "24 tokens" in stats, f"stats under the answer: {stats!r}")
    reasoning = answer.locator("details.reasoning")
    check(reasoning.count() == 1 and not reasoning.evaluate("d => d.open"), "the reasoning is collapsed")
    check(len(reasoning.locator(".reasoning-text").text_content()) > 0, "the reasoning has the model's text")
    seen = page.evaluate("window.progressSeen")
    check(any("Reading the prompt" in s for s in seen), f"prefill progress was shown: {seen[:3]}")
    check(page.locator("#progress").is_hidden(), "the progress bar is gone once tokens come")
    page.screenshot(path=os.path.join(shots, "chat.png"))

    # Stop: a long answer cut by the button.
    # Long enough (the tiny model writes ~600 tokens a second here) to still run when Stop is clicked.
    setting(page, "#max-tokens", "6000")
    setting(page, "#system-prompt", "")
    page.fill("#prompt", "Write a very long story")
    page.press("#prompt", "Enter")
    expect(page.locator("#stop")).to_be_visible()
    expect(page.locator(".message.assistant").last.locator(".reasoning-text")).not_to_be_empty(timeout=30_000)
    page.click("#stop")
    expect(page.locator(".message.assistant").last.locator(".stats")).to_contain_text("stopped")
    check(page.locator("#send").is_visible(), "after Stop the page can send again")

    # A forced tool call, thinking off (the grammar starts at once), shown as a call.
    tools = '[{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", ' \
            '"properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"], "additionalProperties": false}}}]'
    setting(page, "#tools", tools)
    setting(page, "#tool-choice", "required")
    setting(page, "#thinking", "off")
    # The tiny test model's 512-token vocabulary spells a call out in ~70 tokens.
    setting(page, "#max-tokens", "400")
    page.fill("#prompt", "Weather in Paris?")
    page.press("#prompt", "Enter")
    call = page.locator(".message.assistant").last.locator(".tool-call")
    expect(call).to_contain_text("get_weather", timeout=60_000)
    expect(page.locator(".message.assistant").last.locator(".stats")).to_contain_text("tool_calls")
    check('"city"' in call.locator("pre").inner_text(), "the call's arguments are shown")
    page.screenshot(path=os.path.join(shots, "tool-call.png"))

    # Conversations live in localStorage: a reload keeps them.
    count = page.locator(".message").count()
    page.reload()
    expect(page.locator(".message")).to_have_count(count)
    check(page.locator("#api-key").input_value() == key, "settings survive a reload")
    page.click("#new-chat")
    expect(page.locator(".message")).to_have_count(0)
    expect(page.locator("#conversations li")).to_have_count(2)
    page.locator("#conversations li.active .delete").click()
    expect(page.locator("#conversations li")).to_have_count(1)
    page.locator("#conversations li .open").click()
    expect(page.locator(".message")).to_have_count(count)

    # The page's Markdown, in this browser: markup the model writes stays text.
    html = page.evaluate("Markdown.render('<img src=x onerror=alert(1)> **bold** `x<y`\\n\\n```py\\ndef f(): return 1 # c\\n```\\n- a\\n- b')")
    check("<img" not in html and "&lt;img" in html, "raw HTML from the model is escaped")
    check("<strong>bold</strong>" in html and "<code>x&lt;y</code>" in html, "inline Markdown renders")
    check('<span class="hl-k">def</span>' in html and '<span class="hl-c"># c</span>' in html, "code is highlighted")
    check("<ul><li>a</li><li>b</li></ul>" in html, "lists render")
    link = page.evaluate("Markdown.render('[x](javascript:alert(1)) [y](https://example.org)')")
    check('href="javascript' not in link, "only http(s) links become links")
    check('href="https://example.org"' in link, "http(s) links do")

    check(not errors, f"no script errors on the page: {errors}")
    browser.close()

print("web page: all checks passed")

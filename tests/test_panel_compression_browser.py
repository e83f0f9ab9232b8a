"""The panel's compression bits in Chromium: the dashboard's Compression card and a request's levers.

Reuses test_panel_browser's browser and page set-up (and its skip rules: CI's
RAGPROXY_REQUIRE_BROWSER=1 makes a missing Chromium a failure).
"""
from __future__ import annotations

import pytest
from test_panel_browser import _panel_on, browser  # noqa: F401  (first: its skip rules; browser is a fixture)

from conftest import API_KEY, logged_rows, proxy_config  # noqa: E402
from playwright.sync_api import expect  # noqa: E402
from test_compression_e2e import block, chunk_ids  # noqa: E402

EXTRA = """
  - {name: squeeze, upstream: oa, compression: top2}
compression:
  levers: [{name: rag_select, max_chunks: 2}, position_reorder]
  profiles:
    top2:
      levers: [{name: rag_select, max_chunks: 2}]
  state: {backend: redis, redis_url: "redis://:hunter2-secret@cache.internal:6379/0"}
"""


@pytest.fixture
def compressed(make_admin_proxy, fake):
    return make_admin_proxy(proxy_config(fake.url, extra=EXTRA))


@pytest.fixture
def panel(browser, compressed):  # noqa: F811
    yield from _panel_on(browser, compressed)


def test_the_dashboard_card_and_the_request_detail_show_the_levers(panel, compressed, fake):
    import openai
    client = openai.OpenAI(base_url=compressed.url + "/v1", api_key=API_KEY, max_retries=0, timeout=10)
    client.chat.completions.create(model="squeeze", messages=[{"role": "user", "content": block()}])
    assert chunk_ids(fake.last.json["messages"][0]["content"]) == ["c1", "c2"]
    entry = logged_rows(compressed.app, 1)[0]
    panel.login()
    card = panel.tid("compression-card")
    expect(card).to_be_visible()
    expect(card.locator("[data-testid=compression-profile][data-name=top2]")).to_contain_text("squeeze")
    expect(card.locator("[data-testid=compression-profile][data-name=on]")).to_contain_text("position_reorder")
    expect(panel.tid("compression-counter").first).to_contain_text("rag_select")
    expect(card).to_contain_text("cache.internal")
    assert "hunter2" not in card.inner_text()   # the Redis password is never shown
    panel.page.goto(compressed.url + f"/#/logs/{entry['id']}")
    lever = panel.tid("log-lever")
    expect(lever).to_have_count(1)
    expect(lever.first).to_contain_text("applied")
    expect(panel.tid("log-levers")).to_contain_text("1 of 1 applied")


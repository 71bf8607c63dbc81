"""The operator's web settings: read from the environment with the other agent settings,
an allow-list entry without its reason refused with a sentence, the keys never shown, and
which web tools a job is offered decided from them."""

from __future__ import annotations

import pytest

from vmagent.config import AgentConfig, ConfigError, dump
from vmagent.web.agent_tools import WebTools


def test_the_web_settings_come_from_the_environment():
    config = AgentConfig.load(env={
        "VMAGENT_SEARXNG_URL": " http://searxng:8080/ ", "VMAGENT_WEB_ALLOW": "10.1.2.0/24=the docs mirror; docs.lan=the wiki",
        "VMAGENT_WEB_TOOLS": "auto", "VMAGENT_WEB_TIMEOUT_S": "5", "VMAGENT_TAVILY_API_KEY": "tvly-secret"})
    assert config.searxng_url == "http://searxng:8080"
    assert config.web_allow == ["10.1.2.0/24=the docs mirror", "docs.lan=the wiki"]
    assert config.web_tools is None and config.web_timeout_s == 5
    assert "tvly-secret" not in dump(config) and "tvly-secret" not in repr(config)


@pytest.mark.parametrize("env, problem", [
    ({"VMAGENT_WEB_ALLOW": "10.0.0.0/8"}, "web allow-list entry '10.0.0.0/8' has no reason"),
    ({"VMAGENT_SEARXNG_URL": "searxng:8080"}, "needs a scheme"),
    ({"VMAGENT_WEB_MAX_REDIRECTS": "50"}, "web_max_redirects"),
])
def test_a_setting_that_cannot_be_used_is_a_sentence(env, problem):
    with pytest.raises(ConfigError, match=problem):
        AgentConfig.load(env=env)


@pytest.mark.parametrize("settings, offered", [
    ({}, ()),
    ({"searxng_url": "http://searxng:8080"}, ("web_search", "read_page")),
    ({"brave_api_key": "k"}, ("web_search", "read_page")),
    ({"searxng_url": "http://searxng:8080", "web_tools": False}, ()),
    ({"web_tools": True}, ("read_page",)),
    ({"brave_api_key": "  "}, ()),
])
def test_the_tools_offered_follow_the_settings(settings, offered):
    assert WebTools.from_config(AgentConfig(**settings)).names == offered


def test_a_page_read_asking_for_more_than_the_loop_keeps_comes_whole_and_says_where_to_read_on():
    from tests.support.web_pages import PageServer
    from vmagent.loop.compact import cap_tool_result

    pages = PageServer()
    try:
        config = AgentConfig(web_tools=True, tool_result_cap_chars=3000, web_allow=[f"127.0.0.1:{pages.port}=test pages"])
        answer = WebTools.from_config(config).call("read_page", {"url": f"{pages.base}/docs", "max_chars": 100_000})
    finally:
        pages.close()
    assert answer.ok
    assert cap_tool_result(answer.text, config.tool_result_cap_chars) == answer.text  # nothing cut out of it
    assert "read on with read_page offset=" in answer.text

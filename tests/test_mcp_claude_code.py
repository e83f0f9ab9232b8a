"""Claude Code itself, headless, with ragproxy as its MCP server and as its model endpoint.

``claude -p`` (the real binary, from the npm package @anthropic-ai/claude-code)
gets an ``--mcp-config`` naming ragproxy's ``/mcp`` with an API key, and
ANTHROPIC_BASE_URL pointing at the same ragproxy, whose model route has
``kb: null`` (no injection) in front of the fake upstream.  The fake plays the
model: while the conversation holds no result of ``mcp__ragproxy__search`` it
asks for that tool (loading it through ToolSearch first when Claude Code defers
MCP tools, as it does by default), and once the result is there it answers by
quoting it.  The knowledge base holds a passage that no prompt contains, so an
answer carrying it proves the tool call went through ragproxy's MCP server and
back into the model's context.

The binary comes from RAGPROXY_CLAUDE_CODE (.ci/run installs a pinned version
and sets it), else ``claude`` on PATH; without one the module is skipped,
unless RAGPROXY_REQUIRE_CLAUDE_CODE=1 (CI), where that is a failure.  Claude
Code runs with a fresh HOME, telemetry, updates and other outside traffic off.
"""
import json
import os
import re
import shutil
import subprocess
import urllib.request

import pytest

from conftest import API_KEY, logged_rows

CLAUDE = os.environ.get("RAGPROXY_CLAUDE_CODE") or shutil.which("claude")
# CI sets RAGPROXY_REQUIRE_CLAUDE_CODE=1: there a missing Claude Code is a failure, not a skip.
if os.environ.get("RAGPROXY_REQUIRE_CLAUDE_CODE") == "1":
    assert CLAUDE and os.access(CLAUDE, os.X_OK), \
        f"RAGPROXY_REQUIRE_CLAUDE_CODE=1 but Claude Code is not at RAGPROXY_CLAUDE_CODE={CLAUDE!r}"
elif not CLAUDE or not os.access(CLAUDE, os.X_OK):
    pytest.skip("Claude Code is not installed (set RAGPROXY_CLAUDE_CODE to its claude binary)",
                allow_module_level=True)

TOOL = "mcp__ragproxy__search"
SECRET = "the glimmerwick ledger is kept in cabinet 7Q-4471 behind the boiler"
QUESTION = "Where is the glimmerwick ledger kept?"

HANDBOOK = f"""# Facilities handbook

## Records

Archived records: {SECRET}. Ask the facilities desk for the key.

## Parking

Visitors park on level two; the barrier opens with the day pass.
"""


def config_text(fake_url):
    return f"""
api_key_auth: true
api_keys: [{API_KEY}]
providers:
  llm:
    an: {{type: anthropic, base_url: "{fake_url}", api_key: upstream-anthropic-key, read_timeout: 30}}
models:
  - {{name: "*", upstream: an, kb: null}}
knowledge_bases:
  handbook:
    retrieval: lexical
"""


def tool_results(recorded):
    """{tool name: its tool_result block} of the conversation in a recorded /v1/messages request."""
    names, results = {}, {}
    for message in recorded.json.get("messages") or []:
        content = message.get("content") if isinstance(message, dict) else None
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use":
                names[block.get("id")] = block.get("name")
            elif block.get("type") == "tool_result":
                results[names.get(block.get("tool_use_id"))] = block
    return results


def text_of(block):
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def offered(recorded):
    return [tool.get("name") for tool in recorded.json.get("tools") or [] if isinstance(tool, dict)]


def play_the_model(fake):
    """Script the fake upstream as a model that looks the answer up with ragproxy's search tool."""
    def call(recorded):
        if not isinstance(recorded.json, dict) or not recorded.path.startswith("/v1/messages"):
            return None
        done = tool_results(recorded)
        if TOOL in done:
            return None
        tools = offered(recorded)
        if TOOL in tools:
            return TOOL, {"query": "glimmerwick ledger"}
        if "ToolSearch" in tools and "ToolSearch" not in done:   # MCP tools deferred: load the schema first
            return "ToolSearch", {"query": "select:" + TOOL}
        return None

    def reply(recorded):
        done = tool_results(recorded) if isinstance(recorded.json, dict) else {}
        if TOOL in done:
            return "From the knowledge base: " + text_of(done[TOOL])
        return "I could not look it up."

    fake.tool_call_fn = call
    fake.reply_fn = reply


@pytest.fixture
def served(make_proxy, fake, tmp_path):
    docs = tmp_path / "data" / "documents" / "handbook"
    docs.mkdir(parents=True)
    (docs / "facilities.md").write_text(HANDBOOK)
    proxy = make_proxy(config_text(fake.url), data_dir=tmp_path / "data")
    proxy.app.knowledge_bases.index_all()
    play_the_model(fake)
    return proxy


def run_claude(tmp_path, proxy, extra_env=None, mcp_key=API_KEY, mcp_url=None, timeout=180):
    """``claude -p QUESTION --output-format json`` with ``proxy`` as its model endpoint and MCP server
    (``mcp_key`` in the MCP server's Authorization header); returns (CompletedProcess, result)."""
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    mcp_config = {"mcpServers": {"ragproxy": {"type": "http", "url": mcp_url or proxy.url + "/mcp",
                                              "headers": {"Authorization": "Bearer " + mcp_key}}}}
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TMPDIR": str(tmp_path),
        "XDG_CONFIG_HOME": str(home / ".config"), "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_DATA_HOME": str(home / ".local" / "share"), "XDG_STATE_HOME": str(home / ".local" / "state"),
        "ANTHROPIC_BASE_URL": proxy.url, "ANTHROPIC_API_KEY": API_KEY,
        # Nothing but the two local servers: no telemetry, error reports, update checks or other extras.
        "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_BUG_COMMAND": "1",
        "NO_PROXY": "127.0.0.1,localhost",
    }
    env.update(extra_env or {})
    argv = [CLAUDE, "-p", QUESTION, "--output-format", "json", "--mcp-config", json.dumps(mcp_config),
            "--strict-mcp-config", "--allowedTools", TOOL, "--no-session-persistence"]
    proc = subprocess.run(argv, cwd=str(work), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON result from claude (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc, json.loads(lines[-1])


def metric(proxy, name, **labels):
    """One sample of ragproxy's /metrics (0.0 when the series is absent)."""
    request = urllib.request.Request(proxy.url + "/metrics", headers={"Authorization": "Bearer " + API_KEY})
    with urllib.request.urlopen(request, timeout=10) as resp:
        text = resp.read().decode("utf-8")
    for line in text.splitlines():
        found = re.match(r"^%s\{([^}]*)\} (\S+)$" % re.escape(name), line)
        if found and dict(re.findall(r'(\w+)="([^"]*)"', found.group(1))) == labels:
            return float(found.group(2))
    return 0.0


def model_requests(fake):
    return [r for r in fake.requests if r.path == "/v1/messages" and isinstance(r.json, dict)]


@pytest.mark.parametrize("tool_search", ["deferred", "listed"])
def test_claude_code_answers_with_a_passage_only_the_search_tool_could_fetch(served, fake, tmp_path, tool_search):
    """``deferred`` is Claude Code's default (MCP tools named in the prompt, loaded by ToolSearch);
    ``listed`` is ENABLE_TOOL_SEARCH=false, where the tool's schema from tools/list is in every request."""
    proc, result = run_claude(tmp_path, served, {"ENABLE_TOOL_SEARCH": "false"} if tool_search == "listed" else {})
    assert proc.returncode == 0 and result.get("is_error") is False, (proc.stdout, proc.stderr)
    assert SECRET in result["result"]

    requests = model_requests(fake)
    calls = [r for r in requests if TOOL in tool_results(r)]
    assert calls, [offered(r) for r in requests]
    # The passage reached the model only inside the search tool's result, never before it.
    before = [r for r in requests if TOOL not in tool_results(r)]
    assert before and not any(SECRET in r.body.decode("utf-8", "replace") for r in before)
    seen = text_of(tool_results(calls[-1])[TOOL])
    assert SECRET in seen and "handbook/facilities.md" in seen   # and where it is, to read around it
    first = requests[0]
    if tool_search == "listed":
        (schema,) = [t for t in first.json["tools"] if t.get("name") == TOOL]
        assert "query" in schema["input_schema"]["properties"] and schema["description"]
    else:
        assert TOOL not in offered(first) and TOOL in first.body.decode("utf-8")   # named, not yet loaded

    # ragproxy counted exactly one search tool call: the handbook's passage, under the key the model
    # calls came with; those calls had nothing injected (kb: null).
    rows = logged_rows(served.app, len(requests) + 1)
    (tool_row,) = [r for r in rows if r["endpoint"] == "mcp_tool"]
    assert (tool_row["model"], tool_row["outcome"], tool_row["kbs"]) == ("search", "ok", ["handbook"])
    (passage,) = served.app.knowledge_bases.get("handbook").search(SECRET, 1)
    assert tool_row["chunk_ids"][0] == passage.id
    model_rows = [r for r in rows if r["endpoint"] != "mcp_tool"]
    assert len(model_rows) == len(requests) and all(not r["kbs"] for r in model_rows)
    assert {r["client"] for r in model_rows} == {tool_row["client"]}
    assert metric(served, "ragproxy_mcp_tool_calls_total", tool="search", outcome="ok") == 1.0
    assert metric(served, "ragproxy_mcp_tool_seconds_count", tool="search") == 1.0


def test_claude_code_with_a_wrong_key_is_refused_and_the_passage_stays_in_the_kb(served, fake, tmp_path):
    """An MCP key ragproxy does not know (the model key is right): /mcp refuses it, so the model is
    never offered the tool, nothing is searched, and the run still ends by itself."""
    proc, result = run_claude(tmp_path, served, mcp_key="rp-not-a-key")
    assert proc.returncode == 0 and SECRET not in proc.stdout
    requests = model_requests(fake)
    assert requests and not any(TOOL in offered(r) or TOOL in tool_results(r) for r in requests)
    # The model's attempt to load the tool is told why there is none: ragproxy refused the key.
    (note,) = [text_of(tool_results(r)["ToolSearch"]) for r in requests if "ToolSearch" in tool_results(r)]
    assert "ragproxy" in note and "401" in note, note
    assert [r for r in logged_rows(served.app, len(requests)) if r["endpoint"] == "mcp_tool"] == []
    assert metric(served, "ragproxy_mcp_tool_calls_total", tool="search", outcome="ok") == 0.0

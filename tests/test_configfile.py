"""config.yaml on disk (_ragproxy.configfile): the default file, validated atomic writes, reloads.

In-process, on real files under tmp_path: ConfigFile's writes and updates,
write_default_config, and ConfigWatcher, both called directly and as the
thread the server runs.
"""
import os
import re
import threading

import pytest

import ragproxy
from _ragproxy import configfile
from _ragproxy.config import Config
from test_config import MINIMAL, errors_of


def test_watcher_reloads_and_keeps_old_config_on_error(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(MINIMAL)
    app = ragproxy.App(ragproxy.Config.load(str(path), environ={}))
    watcher = ragproxy.ConfigWatcher(app, ragproxy.ConfigFile(str(path), environ={}))
    assert watcher.check() is False  # unchanged
    path.write_text(MINIMAL + "rag: {top_k: 9}\n")
    os.utime(path, ns=(1, 10**9))  # a new mtime even on coarse filesystems
    assert watcher.check() is True and app.config.rag["top_k"] == 9
    path.write_text(MINIMAL + "rag: {top_k: nine}\n")
    os.utime(path, ns=(2, 2 * 10**9))
    assert watcher.check() is False and app.config.rag["top_k"] == 9  # still the good one
    assert watcher.check(force=True) is False


def test_write_default_config_creates_a_loadable_file(tmp_path):
    path = str(tmp_path / "config.yaml")
    key = ragproxy.write_default_config(path)
    config = ragproxy.Config.load(path, environ={})
    assert config.api_keys[0]["key"] == key and key.startswith("rp-")


def test_config_file_write_validates_backs_up_and_detects_outside_changes(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(MINIMAL)
    config_file = ragproxy.ConfigFile(str(path), environ={})
    assert config_file.load().rag["top_k"] == 5 and config_file.changed() is False
    with pytest.raises(ragproxy.ConfigError) as err:
        config_file.write(MINIMAL + "rag: {top_k: nine}\n")
    assert err.value.errors[0][0] == "rag.top_k" and path.read_text() == MINIMAL
    assert not (tmp_path / "config.yaml.bak").exists()
    config = config_file.write(MINIMAL + "rag: {top_k: 9}\n")
    assert config.rag["top_k"] == 9 and (tmp_path / "config.yaml.bak").read_text() == MINIMAL
    assert config_file.changed() is False  # our own write is not news
    path.write_text(MINIMAL)
    os.utime(path, ns=(3, 3 * 10**9))
    assert config_file.changed() is True and config_file.changed() is False


def test_config_file_update_keeps_env_references_and_rejects_bad_changes(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(MINIMAL + 'api_keys: ["${TEAM_KEY}"]\n')
    config_file = ragproxy.ConfigFile(str(path), environ={"TEAM_KEY": "team-key-123"})
    config = config_file.update(lambda data: data.setdefault("rag", {}).update(top_k=3))
    assert config.rag["top_k"] == 3 and config.api_keys[0]["key"] == "team-key-123"
    assert "${TEAM_KEY}" in path.read_text() and "team-key-123" not in path.read_text()
    written = path.read_text()
    with pytest.raises(ragproxy.ConfigError):
        config_file.update(lambda data: data.update(models="not a list"))
    assert path.read_text() == written


# -- configs in the shape of the project ragproxy models its config on --------

DEEP = "server:\n  port: " + "[" * 2000 + "\n"


def test_an_emptied_config_file_keeps_the_running_config(tmp_path, caplog):
    path = tmp_path / "config.yaml"
    path.write_text(MINIMAL + "api_keys: [abcdefgh12]\n")
    app = ragproxy.App(ragproxy.Config.load(str(path), environ={}))
    config_file = ragproxy.ConfigFile(str(path), environ={})
    watcher = ragproxy.ConfigWatcher(app, config_file)
    path.write_text("")   # an editor that truncates before it writes
    os.utime(path, ns=(1, 10**9))
    assert watcher.check() is False and app.config.api_keys[0]["key"] == "abcdefgh12"
    assert any("config reload failed" in r.getMessage() and "empty" in r.getMessage() for r in caplog.records)
    with pytest.raises(ragproxy.ConfigError):   # nor is an admin API change written on top of it
        config_file.update(lambda data: data.setdefault("rag", {}).update(top_k=3))
    assert path.read_text() == ""


def test_deep_nesting_is_a_config_error_with_a_line_and_is_never_written(tmp_path):
    errs = errors_of(DEEP, environ={})
    assert errs == [("", 2, "collections are nested more than 64 levels deep (a config needs a few); check for "
                             "unclosed brackets (column 71)")]
    path = tmp_path / "config.yaml"
    path.write_text(MINIMAL)
    with pytest.raises(ragproxy.ConfigError) as info:   # PUT /admin/api/settings
        ragproxy.ConfigFile(str(path), environ={}).write(DEEP)
    assert info.value.errors[0][1] == 2 and path.read_text() == MINIMAL


def _wait_for(check, what):
    # The watcher runs on its own thread; a generous bound, not a timing assertion.
    for _ in range(500):
        if check():
            return
        threading.Event().wait(0.02)
    raise AssertionError(f"the watcher never {what}")


def _replace(path, text, n):
    """Replace the file in one step, as the watcher must see it: a half-written file, or a
    second change (a later mtime) of the same text, would be one more reload to count."""
    temporary = path.with_name(path.name + ".new")
    temporary.write_text(text)
    os.utime(temporary, ns=(n * 10**9, n * 10**9))   # a new mtime even on coarse filesystems
    os.replace(temporary, path)


def test_the_watcher_thread_applies_good_files_after_a_pathological_one(tmp_path, caplog):
    path = tmp_path / "config.yaml"
    path.write_text(MINIMAL + "server: {reload_interval: 0.01}\n")
    app = ragproxy.App(ragproxy.Config.load(str(path), environ={}))
    watcher = ragproxy.ConfigWatcher(app, ragproxy.ConfigFile(str(path), environ={}))
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        for n, bad in enumerate([DEEP, "models: " + "{a: " * 3000, "", "k:\n" + "".join(
                " " * i + f"k{i}:\n" for i in range(1, 500))], start=1):
            _replace(path, bad, 2 * n)
            _wait_for(lambda: sum("config reload failed" in r.getMessage() for r in caplog.records) == n,
                      "reported the bad file")
            _replace(path, MINIMAL + f"server: {{reload_interval: 0.01}}\nrag: {{top_k: {n}}}\n", 2 * n + 1)
            _wait_for(lambda: app.config.rag["top_k"] == n, "applied the good file")
        assert thread.is_alive()
    finally:
        watcher.stop()
        thread.join(10)


class _Exploding:
    """A config file whose load fails the way no ConfigError describes, then works."""

    def __init__(self, real, failures):
        self.real, self.failures, self.path = real, list(failures), real.path

    def changed(self):
        return True

    def load(self):
        if self.failures:
            raise self.failures.pop(0)
        return self.real.load()


def test_the_watcher_thread_outlives_any_exception_in_a_reload(tmp_path, caplog):
    path = tmp_path / "config.yaml"
    path.write_text(MINIMAL + "server: {reload_interval: 0.01}\n")
    app = ragproxy.App(ragproxy.Config.load(str(path), environ={}))
    watcher = ragproxy.ConfigWatcher(app, _Exploding(ragproxy.ConfigFile(str(path), environ={}),
                                                     [RecursionError("deep"), RuntimeError("boom"), MemoryError()]))
    path.write_text(MINIMAL + "server: {reload_interval: 0.01}\nrag: {top_k: 7}\n")
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        _wait_for(lambda: app.config.rag["top_k"] == 7, "applied the good file")
    finally:
        watcher.stop()
        thread.join(10)
    failures = [r for r in caplog.records if r.getMessage().startswith("config reload failed")]
    assert len(failures) == 3 and all(r.exc_info for r in failures)   # with the traceback: a bug to report


def test_a_reload_that_fails_half_way_puts_the_old_config_back(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text(MINIMAL)
    app = ragproxy.App(ragproxy.Config.load(str(path), environ={}))
    old = app.config
    watcher = ragproxy.ConfigWatcher(app, ragproxy.ConfigFile(str(path), environ={}))
    real_reload = app.reload

    def reload(config):
        real_reload(config)
        if config is not old:
            raise RuntimeError("a part of the app refused the new config")

    monkeypatch.setattr(app, "reload", reload)
    _replace(path, MINIMAL + "rag: {top_k: 9}\n", 5)
    with pytest.raises(RuntimeError):
        watcher.check()
    assert app.config is old


# -- fuzzing the whole load: a Config or a ConfigError, nothing else ----------


def test_the_default_configs_commented_compression_example_loads_when_uncommented():
    text = configfile.DEFAULT_CONFIG_TEMPLATE.replace("@@API_KEY@@", "rp-" + "a" * 32)
    text = text.replace("    # compression: on ", "    compression: on #")
    text = text.replace("    # context_window: 32768", "    context_window: 32768")
    text = re.sub(r"^# (compression:|  levers:|  profiles:|    agent:|  state:)", r"\1", text, flags=re.M)
    config = Config.from_text(text, source="config.yaml")
    assert [lever["name"] for lever in config.raw["compression"]["levers"]] == [
        "rag_select", "compact_serialization", "position_reorder", "window_fit"]
    assert list(config.raw["compression"]["profiles"]) == ["agent"]
    assert config.raw["compression"]["state"]["backend"] == "sqlite"
    route = config.models[0]
    assert (route.compression, route.context_window) == ("on", 32768)

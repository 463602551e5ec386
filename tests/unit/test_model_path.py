"""model.path: a Hugging Face model directory, or a model name already in this host's Hugging
Face cache (read offline, never downloaded); anything else is one line saying which it is not.
The cache is a real one, laid out as huggingface_hub lays it out, in a temporary directory."""

from __future__ import annotations

import pytest
from huggingface_hub import constants
from typer.testing import CliRunner

from common.errors import ConfigError
from common.host.model_dir import local_model_dir
from launch.cli import app

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """A Hugging Face cache holding model acme/tiny (config.json only) at `REVISION`."""
    cache = tmp_path / "hub"
    repo = cache / "models--acme--tiny"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "gpt2"}')
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return snapshot


def test_a_model_name_in_the_local_cache_is_its_snapshot_directory(hf_cache, tmp_path):
    assert local_model_dir("acme/tiny") == hf_cache.resolve()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.json").write_text("{}")
    assert local_model_dir(str(tmp_path / "mine")) == (tmp_path / "mine").resolve()


@pytest.mark.parametrize("path", ["acme/absent", "not a name!", "/no/such/model"])
def test_anything_else_says_it_is_neither_a_directory_nor_a_cached_model(hf_cache, path):
    with pytest.raises(ConfigError, match="nor a model in its Hugging Face cache") as caught:
        local_model_dir(path)
    assert str(hf_cache.parents[2]) in str(caught.value)  # the cache it looked in
    assert "nothing is downloaded" in str(caught.value)


def test_launch_takes_a_cached_model_by_name(hf_cache, tmp_path, monkeypatch):
    """Through the CLI, up to the run's config: the name became the cached directory."""
    from common import config as C
    from common.files import run_files as RF

    run_dir = tmp_path / "run"
    monkeypatch.setattr("launch.local.run", lambda *a, **k: 0)  # the run itself is not the point
    result = CliRunner().invoke(
        app, ["launch", "--run-dir", str(run_dir), "--model", "acme/tiny", "--no-eval",
              "--no-live", "--engine", "fake"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert C.load(run_dir / RF.CONFIG).model.path == str(hf_cache.resolve())

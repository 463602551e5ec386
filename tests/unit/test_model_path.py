"""model.path: a Hugging Face model directory, or a model name: from this host's Hugging Face
cache, else downloaded into it once (a faked Hub: no network here), never under
HF_HUB_OFFLINE=1; anything else is one line saying which it is not. The cache is a real one,
laid out as huggingface_hub lays it out, in a temporary directory."""

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


def test_a_name_not_cached_stays_offline_under_hf_hub_offline(hf_cache, monkeypatch):
    import huggingface_hub

    asked: list[bool] = []
    real = huggingface_hub.snapshot_download

    def watched(name, **kwargs):
        asked.append(kwargs.get("local_files_only", False))
        return real(name, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", watched)
    with pytest.raises(ConfigError, match="nor a model in its Hugging Face cache") as caught:
        local_model_dir("acme/absent")
    assert str(hf_cache.parents[2]) in str(caught.value)  # the cache it looked in
    assert "HF_HUB_OFFLINE=1: nothing is downloaded" in str(caught.value)
    assert asked == [True]  # the cache only


@pytest.mark.parametrize("path", ["not a name!", "/no/such/model", "../up/one"])
def test_anything_else_says_it_is_neither_a_directory_nor_a_model_name(hf_cache, path):
    with pytest.raises(ConfigError, match="nor a model name as on the Hugging Face Hub"):
        local_model_dir(path)


@pytest.fixture
def fake_hub(hf_cache, monkeypatch):
    """The Hub, faked: `snapshot_download` of acme/new writes its snapshot into the cache (as
    huggingface_hub does) and counts the downloads; the host is online."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.delenv("HF_HUB_OFFLINE")
    snapshot = hf_cache.parents[2] / "models--acme--new" / "snapshots" / REVISION
    downloads: list[list[str]] = []

    def snapshot_download(name, *, local_files_only=False, allow_patterns=None):
        assert name == "acme/new"
        if not local_files_only:
            downloads.append(allow_patterns)
            snapshot.mkdir(parents=True)
            (snapshot / "config.json").write_text('{"model_type": "gpt2"}')
        if not (snapshot / "config.json").exists():
            raise LocalEntryNotFoundError("not in the cache")
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return snapshot, downloads


def test_a_model_name_is_downloaded_once_into_the_cache_saying_so(fake_hub, capfd):
    snapshot, downloads = fake_hub
    assert local_model_dir("acme/new") == snapshot
    assert local_model_dir("acme/new") == snapshot  # the second time from the cache
    assert len(downloads) == 1
    assert "*.safetensors" in downloads[0]
    assert "*.bin" not in downloads[0]
    said = capfd.readouterr().err
    assert said.count("downloading the model acme/new from the Hugging Face Hub into ") == 1


def test_a_download_that_fails_is_one_line(hf_cache, monkeypatch):
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")

    def snapshot_download(name, *, local_files_only=False, allow_patterns=None):
        if local_files_only:
            raise OSError("not cached")
        raise ConnectionError("Max retries exceeded with url: /api/models/acme/gone\nmore")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    with pytest.raises(ConfigError) as caught:
        local_model_dir("acme/gone")
    assert str(caught.value) == (
        "model.path = 'acme/gone': not a local directory, and downloading it from the Hugging "
        "Face Hub failed: ConnectionError: Max retries exceeded with url: /api/models/acme/gone"
    )


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

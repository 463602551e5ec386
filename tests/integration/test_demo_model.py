"""The embedded demo model: a loadable, deterministic HF directory; evaluation and snapshots.

Fast tests build with `TINY` (a handful of warm-up steps); the `slow` test builds the real
default recipe and checks it lands in the accuracy window GRPO needs.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from common.errors import SnapshotError
from common.task.synthetic import make_examples
from consumer.evaluation import greedy_accuracy
from consumer.evaluation.greedy import accuracy_of, load_model
from launch import demo_model
from launch.demo_model import DEFAULT_RECIPE, Recipe, build_demo_model, ensure_demo_model

TINY = Recipe(learn_steps=4, sloppy_steps=2, batch_size=8)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("demo") / "model", recipe=TINY)


def test_the_directory_loads_offline_with_auto_classes(tiny_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    cfg = model.config
    assert cfg.model_type == "llama"
    assert cfg.hidden_size // cfg.num_attention_heads == 64  # a head size vLLM supports
    assert cfg.max_position_embeddings >= 128
    assert next(model.parameters()).dtype == torch.float32
    assert len(tokenizer) == cfg.vocab_size == 18
    assert tokenizer.eos_token_id == cfg.eos_token_id
    assert tokenizer.pad_token_id == cfg.pad_token_id
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    ids = tokenizer("07+45=")["input_ids"]
    assert len(ids) == 6  # one token per character, no BOS
    assert tokenizer.decode([*tokenizer("052")["input_ids"], tokenizer.eos_token_id]) == "052<eos>"
    assert tokenizer.decode([*ids, tokenizer.eos_token_id], skip_special_tokens=True) == "07+45="
    assert tokenizer.convert_ids_to_tokens(tokenizer("x")["input_ids"]) == ["<unk>"]


def test_two_builds_with_one_seed_write_identical_weights(tiny_dir: Path, tmp_path: Path) -> None:
    again = build_demo_model(tmp_path / "again", recipe=TINY)
    other = build_demo_model(tmp_path / "other", recipe=TINY, seed=1)
    first, second = (
        load_file(tiny_dir / "model.safetensors"),
        load_file(again / "model.safetensors"),
    )
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    third = load_file(other / "model.safetensors")
    assert not all(torch.equal(first[k], third[k]) for k in first)


def test_greedy_accuracy_reports_consistent_counts(tiny_dir: Path) -> None:
    result = greedy_accuracy(tiny_dir, n=40, batch_size=16)
    assert result.total == 40
    assert 0 <= result.correct <= 40
    assert result.accuracy == result.correct / 40


def test_accuracy_of_restores_mode_and_padding_side(tiny_dir: Path) -> None:
    model, tokenizer = load_model(tiny_dir)
    model.train()
    tokenizer.padding_side = "right"
    examples = make_examples("heldout", 8)
    assert accuracy_of(model, tokenizer, examples).total == 8
    assert model.training
    assert tokenizer.padding_side == "right"


def test_a_snapshot_overrides_the_weights(tiny_dir: Path, tmp_path: Path) -> None:
    model, _ = load_model(tiny_dir)
    trained = {k: (v + 0.01 * torch.randn_like(v)).to(torch.bfloat16) for k, v in _untied(model)}
    path = tmp_path / "model.safetensors"
    save_file(trained, path)
    loaded, _ = load_model(tiny_dir, snapshot=path)
    own = loaded.state_dict()
    for key, value in trained.items():
        assert own[key].dtype == torch.float32
        assert torch.equal(own[key], value.to(torch.float32))
    assert torch.equal(own["lm_head.weight"], own["model.embed_tokens.weight"])  # still tied
    assert greedy_accuracy(tiny_dir, snapshot=tmp_path, n=8).total == 8  # a directory works too


def test_a_snapshot_that_does_not_fit_is_refused(tiny_dir: Path, tmp_path: Path) -> None:
    model, _ = load_model(tiny_dir)
    state = dict(_untied(model))
    for name, broken in [
        ("extra", {**state, "model.extra.weight": torch.zeros(2)}),
        ("missing", {k: v for k, v in state.items() if "layers.0.mlp" not in k}),
        ("shape", {**state, "model.norm.weight": torch.zeros(3)}),
    ]:
        save_file(broken, tmp_path / f"{name}.safetensors")
        with pytest.raises(SnapshotError, match="does not fit"):
            load_model(tiny_dir, snapshot=tmp_path / f"{name}.safetensors")


def test_ensure_builds_once_even_when_two_callers_race(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    builds: list[Path] = []
    real_build = demo_model.build_demo_model

    def counting_build(out_dir: Path, **kwargs: object) -> Path:
        builds.append(out_dir)
        return real_build(out_dir, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(demo_model, "build_demo_model", counting_build)
    target = tmp_path / "cache" / "demo"
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_demo_model(target, recipe=TINY)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert results == [target, target]
    assert len(builds) == 1
    assert (target / "config.json").exists()
    assert ensure_demo_model(target, recipe=TINY) == target
    assert len(builds) == 1
    leftovers = [p.name for p in target.parent.iterdir() if p.name.startswith(".demo-")]
    assert leftovers == []
    # readable by the group and others, as pip installs files (mkdtemp alone makes it 0700)
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o777 & ~umask
    assert (target / "config.json").stat().st_mode & 0o777 == 0o666 & ~umask
    said = capfd.readouterr().err  # the build says how far its warm-up has got
    assert "building the demo model: 1/6 warm-up steps (17%), " in said


def test_the_cache_directory_names_the_recipe() -> None:
    assert DEFAULT_RECIPE.name in demo_model.default_demo_dir().name
    assert demo_model.default_demo_dir(TINY) != demo_model.default_demo_dir()


@pytest.mark.slow
def test_the_default_recipe_is_sometimes_right(tmp_path: Path) -> None:
    """Greedy held-out accuracy in the window GRPO needs, and samples that are often right."""
    model_dir = build_demo_model(tmp_path / "demo")
    greedy = greedy_accuracy(model_dir)
    assert 0.10 <= greedy.accuracy <= 0.60, greedy
    model, tokenizer = load_model(model_dir)
    mean, pass8 = _sample_accuracy(model, tokenizer, num_prompts=128, group_size=8)
    assert mean >= 0.05
    assert pass8 >= 0.3


def _untied(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """State dict items with tied duplicates removed, as the trainer's snapshots store them."""
    seen: set[int] = set()
    out = []
    for key, value in model.state_dict().items():
        if value.data_ptr() not in seen:
            seen.add(value.data_ptr())
            out.append((key, value.detach().clone()))
    return out


@torch.inference_mode()
def _sample_accuracy(
    model: torch.nn.Module, tokenizer: object, *, num_prompts: int, group_size: int
) -> tuple[float, float]:
    from common.task.synthetic import is_correct

    torch.manual_seed(0)
    examples = make_examples("heldout", num_prompts)
    prompts = [e.prompt for e in examples for _ in range(group_size)]
    ids = torch.tensor(tokenizer(prompts)["input_ids"])  # type: ignore[operator]
    out = model.generate(  # type: ignore[operator]
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=5,
    )
    texts = tokenizer.batch_decode(out[:, ids.shape[1] :], skip_special_tokens=True)  # type: ignore[attr-defined]
    right = torch.tensor(
        [is_correct(t, examples[i // group_size].answer) for i, t in enumerate(texts)]
    ).view(num_prompts, group_size)
    return right.float().mean().item(), right.any(dim=1).float().mean().item()

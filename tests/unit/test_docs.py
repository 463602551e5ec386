"""README.md and docs/ say only what holds (the checks: tests/docs_check.py).

Every page's relative links and anchors, every command shown (one test id per command: run
`pytest -v` on this file to see them), every repository path and dotted name in the prose, the
two file maps, the generated config reference and the README's length; then each check is shown
to find what it is for (a broken link, a misspelt option, a stale path).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from docs_check import (
    PACKAGES,
    PAGES,
    ROOT,
    anchors,
    command_problems,
    configured_commands,
    link_problems,
    prose_path_problems,
    section,
    shell_commands,
    simple_commands,
    tree_entries,
)
from typer.testing import CliRunner

from common import config as C
from launch.cli import app

SHOWN = [(where, cmd) for page in PAGES for where, cmd in shell_commands(page, page.read_text())]


# -- the pages as they are -----------------------------------------------------------------------
def test_there_are_pages_links_and_commands_to_check() -> None:
    assert len(PAGES) >= 9
    assert len(SHOWN) > 40
    assert {c.split()[1] for _, c in SHOWN if c.startswith("asyncgrpo ")} >= {
        "launch", "consumer", "producer", "keys", "stress", "status", "config",
    }  # fmt: skip


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert not link_problems(page, page.read_text())


@pytest.mark.parametrize(("where", "command"), SHOWN, ids=[f"{w} {c}"[:120] for w, c in SHOWN])
def test_every_command_shown_is_valid(where: str, command: str) -> None:
    assert not command_problems(command, mention=where.endswith("(inline)")), where


CONFIGURED = [(where, cmd) for where, cmd in SHOWN if configured_commands(cmd)]


def test_the_configs_of_the_newest_pages_are_among_those_loaded() -> None:
    named = {config for _, cmd in CONFIGURED for config, *_ in configured_commands(cmd)}
    newest = ("episodes/calculator", "code_task/code", "real_model/smollm2", "custom_task/custom")
    assert {f"docs/{name}.toml" for name in newest} <= named
    sets = [s for _, cmd in CONFIGURED for _, given, _ in configured_commands(cmd) for s in given]
    assert "model.lora.enabled=true" in sets  # docs/lora.md's run


@pytest.mark.parametrize(
    ("where", "command"), CONFIGURED, ids=[f"{w} {c}"[:120] for w, c in CONFIGURED]
)
def test_every_config_a_command_shows_loads_and_its_functions_import(
    where: str, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repository's config file a shown command names, with the command's `--set`s, is a
    valid config; its reward functions and environment import with the command's PYTHONPATH."""
    from producer.episodes.calls import resolve_env
    from producer.rewards.calls import resolve

    for config, sets, pythonpath in configured_commands(command):
        cfg = C.load(ROOT / config if config else None, sets)
        if pythonpath is None:
            continue
        for folder in pythonpath:
            monkeypatch.syspath_prepend(str(ROOT / folder))
        for spec in cfg.rewards.fns:
            resolve(spec.fn)
        if cfg.episodes.env:
            resolve_env(cfg.episodes.env)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_and_name_in_the_prose_exists(page: Path) -> None:
    assert not prose_path_problems(page, page.read_text())


def test_the_file_map_lists_exactly_the_files_there_are() -> None:
    listed = tree_entries(section(ROOT / "docs" / "architecture.md", "The files, room by room"))
    missing = [p for p in listed if not (ROOT / p).exists()]
    assert not missing, f"docs/architecture.md's file map names what is not there: {missing}"
    there = {
        str(p.relative_to(ROOT))
        for top in (*PACKAGES, "bench", "tests", "docs")
        for p in (ROOT / top).rglob("*")
        if p.suffix in (".py", ".md") and p.name != "__init__.py" and "__pycache__" not in p.parts
        and not p.name.startswith("test_")
    }  # fmt: skip
    unlisted = sorted(there - listed)
    assert not unlisted, f"add a line for each to docs/architecture.md's file map: {unlisted}"


def test_the_readme_package_map_has_one_line_per_package() -> None:
    listed = {p.rstrip("/") for p in tree_entries(section(ROOT / "README.md", "Packages"))}
    packages = {
        str(p.parent.relative_to(ROOT))
        for top in PACKAGES
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert packages <= listed, f"README's package map lacks {sorted(packages - listed)}"
    assert all((ROOT / p).is_dir() for p in listed), listed


def test_the_config_reference_is_what_config_docs_prints() -> None:
    result = CliRunner().invoke(app, ["config", "docs"])
    assert result.exit_code == 0, result.output
    printed = result.output.strip().splitlines()
    assert len(printed) > 50
    page = (ROOT / "docs" / "config.md").read_text().splitlines()
    start = page.index(printed[0])
    table = page[start:]
    table = table[: next((i for i, line in enumerate(table) if not line.startswith("|")), None)]
    assert table == printed, "docs/config.md is out of date: paste `asyncgrpo config docs`"


def test_the_readme_stays_short() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


# -- the checks themselves: each finds what it is for ---------------------------------------------
PAGE = ROOT / "docs" / "page.md"  # where the examples below pretend to live


def test_a_link_to_nothing_or_to_a_missing_heading_is_found() -> None:
    good = "# Title\n\n## A part\n\n[a](architecture.md#a-group) [b](#a-part) [c](../README.md)\n"
    assert link_problems(PAGE, good) == []
    bad = good + "[d](archtecture.md) [e](architecture.md#a-grup) [f](#no-part) [g](../..)\n"
    problems = link_problems(PAGE, bad)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "no such file or directory",
        "no heading #a-grup there",
        "no heading #no-part on this page",
        "no such file or directory",  # outside the repository
    ]
    assert link_problems(PAGE, "```\n[x](nowhere.md)\n```\n") == []  # code, not a link


def test_github_heading_anchors() -> None:
    text = "# The files, room by room\n## `asyncgrpo stress` → runs\n## A part\n## A part\n"
    assert anchors(text) == {
        "the-files-room-by-room",
        "asyncgrpo-stress--runs",
        "a-part",
        "a-part-1",
    }


def test_a_misspelt_command_option_or_file_is_found() -> None:
    assert command_problems("asyncgrpo consumer --run-dir runs/x --steps 10 -s a.b=1") == []
    cases = {
        "asyncgrpo consumer --run-dri runs/x": "No such option: --run-dri",
        "asyncgrpo consumr --steps 1": "has no command 'consumr'",
        "asyncgrpo config shw": "has no command 'shw'",
        "asyncgrpo keys keys/ extra": "unexpected arguments ['extra']",
        "asyncgrpo launch --steps": "requires an argument",
        "python -m launch.cli consumer --stepz 3": "No such option: --stepz",
        "torchrun --nproc-per-node 2 -m launch.cli consumer --bnd 0.0.0.0": "No such option: --bnd",
        "python bench/vs_loop.py --seedz 0": "defines no option --seedz",
        "bench/learner_step.py --device cuda --shap qwen05": "defines no option --shap",
        "python bench/vs_lop.py": "no such file bench/vs_lop.py",
        "python3 -m launch.cil": "no module launch.cil",
        "bash .ci/rnu": "no such file .ci/rnu",
        "pip install -c .ci/lock.txt -e '.[dve]'": "declares no extra dve",
        "pip install -c .ci/lck.txt -e .": "no constraints file .ci/lck.txt",
        'mutmut run "consumer.leases*"': "no module matching 'consumer.leases*'",
        "PYTHONPATH=docs/custom_tsk asyncgrpo producer": "no such path docs/custom_tsk",
        "true && asyncgrpo lanch": "has no command 'lanch'",
    }
    for command, problem in cases.items():
        found = command_problems(command)
        assert any(problem in p for p in found), (command, found)
    assert command_problems("asyncgrpo stress --external-producers", mention=True) == []


def test_commands_are_read_from_shell_blocks_and_inline_code_as_a_shell_would() -> None:
    text = (
        "Run `asyncgrpo launch --steps 5`, or `ruff check .`:\n\n"
        "```bash\n# a comment\nasyncgrpo consumer --model demo \\\n    --steps 3   # note\n```\n\n"
        "```console\n$ asyncgrpo status runs/x\noutput, not a command\n```\n\n"
        '```python\nasyncgrpo = "not a command"\n```\n\n'
        "```\nasyncgrpo report runs/x\n```\n\n"  # no language, a command: checked
        "```\nstep 3/5 reward 0.2\n```\n"  # no language, output: not
    )
    shown = shell_commands(PAGE, text)
    assert [(w, simple_commands(c)) for w, c in shown] == [
        ("docs/page.md:5", [["asyncgrpo", "consumer", "--model", "demo", "--steps", "3"]]),
        ("docs/page.md:10", [["asyncgrpo", "status", "runs/x"]]),
        ("docs/page.md:19", [["asyncgrpo", "report", "runs/x"]]),
        ("docs/page.md:1 (inline)", [["asyncgrpo", "launch", "--steps", "5"]]),
    ]


def test_a_stale_path_or_name_in_the_prose_is_found() -> None:
    text = (
        "See `consumer/server/leases.py`, consumer/leases.py and `consumer.trainer.loss_options`.\n"
    )
    problems = prose_path_problems(PAGE, text)
    assert problems == [
        "docs/page.md:1: no consumer/leases.py",
        "docs/page.md:1: no consumer.trainer.loss_options",
    ]
    assert prose_path_problems(PAGE, "`producer.max_in_flight` is a config key\n") == []


def test_a_file_tree_is_read_by_its_indentation() -> None:
    lines = [
        "consumer/            the learner side",
        "  server/            the network thread",
        "    leases.py        leases and the ledger",
        "                     (a description that goes on)",
        "  learner.py         the process",
        "launch/              what a user starts",
        "  configs/demo.toml  the embedded default run",
    ]
    assert tree_entries(lines) == {
        "consumer", "consumer/server", "consumer/server/leases.py", "consumer/learner.py",
        "launch", "launch/configs/demo.toml",
    }  # fmt: skip


def test_a_command_is_read_for_its_config_settings_and_pythonpath() -> None:
    shown = "PYTHONPATH=docs/episodes asyncgrpo launch -c docs/episodes/calculator.toml -s a.b=1"
    assert configured_commands(shown) == [
        ("docs/episodes/calculator.toml", ["a.b=1"], ["docs/episodes"])
    ]
    assert configured_commands("asyncgrpo config show --set a.b=1") == [("", ["a.b=1"], None)]
    assert configured_commands("asyncgrpo launch --config mine.toml --set a.b=1") == []  # theirs
    assert configured_commands("asyncgrpo launch --set run.seed=S") == []  # a placeholder
    assert configured_commands("asyncgrpo launch --steps 3") == []  # nothing to load


def test_a_misspelt_key_or_a_reward_not_on_the_shown_path_is_found() -> None:
    from common.errors import ConfigError
    from producer.rewards.calls import resolve

    with pytest.raises(ConfigError, match=r"train\.lrr"):
        C.load(None, ["train.lrr=1e-4"])
    with pytest.raises(ConfigError, match="cannot import 'within_nowhere:within'"):
        resolve("within_nowhere:within")


def test_launch_env_guess_without_a_config_runs_the_multi_turn_demo() -> None:
    """What `asyncgrpo launch --env guess` (docs/episodes.md) loads; the run itself:
    tests/e2e/test_launch.py (slow)."""
    from launch.cli.app import demo_config

    assert C.load(demo_config("guess")).episodes.env == "guess"
    assert C.load(demo_config(None)).episodes.env == ""

"""The config tree: defaults, TOML, `--set` coercion, validation messages, round trips, help."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import logging
import textwrap
import tomllib
import typing
from pathlib import Path

import pytest
import tomli_w

from common import config as C
from common.errors import ConfigError


def with_sets(*sets: str) -> C.Config:
    return C.apply_overrides(C.Config(), list(sets))


def all_keys() -> list[str]:
    """Every key; a nested table's (`[model.lora]`) as `model.lora.rank`."""

    def keys(prefix: str, cls: type) -> list[str]:
        hints = typing.get_type_hints(cls)
        return [
            key
            for f in dataclasses.fields(cls)
            for key in (
                keys(f"{prefix}.{f.name}", hints[f.name])
                if dataclasses.is_dataclass(hints[f.name])
                else [f"{prefix}.{f.name}"]
            )
        ]

    return [key for name, cls in C._section_types().items() for key in keys(name, cls)]


# ---------------------------------------------------------------------------------------------
# Defaults and loading


def test_defaults_validate():
    assert C.problems(C.Config()) == []
    C.validate(C.Config())
    assert C.load(None) == C.Config()


def test_a_toml_file_overrides_defaults_and_keeps_the_rest(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(
        '[sampling]\ngroup_size = 4\ntemperature = 0.7\n\n[net]\nbind_host = "localhost"\n'
        '[[rewards.fns]]\nfn = "exact_match"\nweight = 0.5\n'
        '[[rewards.fns]]\nfn = "mypkg.rewards:length"\nweight = 2\n'
    )
    cfg = C.load(path)
    assert (cfg.sampling.group_size, cfg.sampling.temperature) == (4, 0.7)
    assert cfg.net.bind_host == "localhost"
    assert cfg.rewards.fns == [
        C.RewardSpec("exact_match", 0.5),
        C.RewardSpec("mypkg.rewards:length", 2.0),
    ]
    assert isinstance(cfg.rewards.fns[1].weight, float)
    assert cfg.train == C.TrainConfig()
    assert cfg.sampling.max_new_tokens == C.SamplingConfig().max_new_tokens


def test_overrides_apply_after_the_file(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[sampling]\ngroup_size = 4\n")
    cfg = C.load(path, ["sampling.group_size=6"])
    assert cfg.sampling.group_size == 6


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"nope\.toml does not exist"):
        C.load(tmp_path / "nope.toml")


def test_invalid_toml_is_refused_with_the_file_name(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[sampling\ngroup_size = 4\n")
    with pytest.raises(ConfigError, match=r"bad\.toml: not valid TOML"):
        C.load(path)


def test_load_validates(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[sampling]\ngroup_size = 1\n")
    with pytest.raises(ConfigError, match=r"sampling\.group_size"):
        C.load(path)


# ---------------------------------------------------------------------------------------------
# --set coercion


@pytest.mark.parametrize(
    ("item", "key", "expected"),
    [
        ("sampling.group_size=4", "sampling.group_size", 4),
        ("train.micro_batch_tokens=1_000", "train.micro_batch_tokens", 1000),
        ("train.lr=3e-6", "train.lr", 3e-6),
        ("sampling.temperature=1", "sampling.temperature", 1.0),
        ("run.resume=true", "run.resume", True),
        ("run.resume=false", "run.resume", False),
        ("run.resume=yes", "run.resume", True),
        ("run.resume=1", "run.resume", True),
        ("run.resume=0", "run.resume", False),
        ('run.resume="true"', "run.resume", True),
        ('producer.id="1e3"', "producer.id", "1e3"),
        ("task.shuffle=False", "task.shuffle", False),
        ("net.bind_host=0.0.0.0", "net.bind_host", "0.0.0.0"),
        ("net.bind_host=::1", "net.bind_host", "::1"),
        ('task.prompt_field="question"', "task.prompt_field", "question"),
        ("task.prompt_field=question", "task.prompt_field", "question"),
        ("net.connect=tcp://10.1.2.3:5555", "net.connect", "tcp://10.1.2.3:5555"),
        ("model.path=runs/x/snapshots/v000003", "model.path", "runs/x/snapshots/v000003"),
        ("producer.id=7", "producer.id", "7"),
        ("producer.id=1e3", "producer.id", "1e3"),
        ("producer.id=0x1F", "producer.id", "0x1F"),
        ("producer.id=true", "producer.id", "true"),
        ("model.path=1.10", "model.path", "1.10"),
        ("run.dir=2024-01-01", "run.dir", "2024-01-01"),
        ("run.dir=", "run.dir", ""),
        ("train.betas=[0.9, 0.95]", "train.betas", [0.9, 0.95]),
        ("train.betas=[1, 0]", "train.betas", [1.0, 0.0]),
        (
            'rewards.fns=[{fn = "math_verify", weight = 2}, {fn = "m:f"}]',
            "rewards.fns",
            [C.RewardSpec("math_verify", 2.0), C.RewardSpec("m:f", 1.0)],
        ),
        ("model.dtype=bfloat16", "model.dtype", "bfloat16"),
    ],
)
def test_set_parses_the_value_as_the_key_type(item, key, expected):
    section, name = key.split(".")
    value = getattr(getattr(with_sets(item), section), name)
    assert value == expected
    assert type(value) is type(expected)


def test_later_overrides_win():
    assert with_sets("sampling.group_size=4", "sampling.group_size=6").sampling.group_size == 6


@pytest.mark.parametrize("item", ["sampling.group_size", "group_size=4", "=4"])
def test_set_without_section_key_and_value_is_refused(item):
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        with_sets(item)


def test_set_with_an_empty_section_is_refused():
    with pytest.raises(ConfigError, match=r"unknown section \[\]"):
        with_sets(".group_size=4")


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("sampling.group_size=eight", "sampling.group_size must be int, got 'eight'"),
        ("sampling.group_size=8.0", "sampling.group_size must be int, got 8.0"),
        ("sampling.group_size=true", "sampling.group_size must be int, got True"),
        ("sampling.temperature=true", "sampling.temperature must be float"),
        ("sampling.temperature=warm", "sampling.temperature must be float"),
        ("run.resume=maybe", "run.resume must be bool, got 'maybe'"),
        ("run.resume=2", "run.resume must be bool, got '2'"),
        ("train.betas=0.9", "train.betas must be a list"),
        ("train.betas=[0.9, 'a']", r"train.betas\[1\] must be float"),
        ("rewards.fns=[1]", r"rewards.fns\[0\] must be a table"),
        ("rewards.fns=[{weight = 'x'}]", r"rewards.fns\[0\].weight must be float"),
        ("model.dtype=float16", "model.dtype = 'float16' is not one of 'float32', 'bfloat16'"),
        ("producer.engine=sglang", "producer.engine = 'sglang' is not one of"),
    ],
)
def test_a_value_of_the_wrong_type_is_refused_naming_the_key(item, message):
    with pytest.raises(ConfigError, match=message):
        with_sets(item)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"model": {"path": [1, 2]}}, "model.path must be str"),
        ({"model": {"path": True}}, "model.path must be str"),
        ({"run": {"resume": 1}}, "run.resume must be bool, got 1"),
        ({"run": {"seed": "0"}}, "run.seed must be int, got '0'"),
        ({"rewards": {"fns": {"fn": "x"}}}, "rewards.fns must be a list"),
    ],
)
def test_a_toml_value_of_the_wrong_type_is_refused_naming_the_key(data, message):
    with pytest.raises(ConfigError, match=message):
        C.from_dict(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"samplng": {}}, r"unknown section \[samplng\] \(did you mean 'sampling'\?\)"),
        ({"sampling": {"group_sise": 4}}, r"sampling.group_sise \(did you mean 'group_size'\?\)"),
        ({"rewards": {"fns": [{"fnn": "x"}]}}, r"rewards.fns\[0\].fnn \(did you mean 'fn'\?\)"),
        ({"zzz": {}}, r"unknown section \[zzz\]$"),
        ({"sampling": {"qqqqqq": 1}}, r"unknown key sampling.qqqqqq$"),
        ({"run": {"max_staleness": 2}}, r"run.max_staleness \(did you mean 'staleness.max_st"),
        ({"train": {"model_path": "x"}}, r"train.model_path \(did you mean 'model.path'\?\)"),
        ({"run": 5}, r"\[run\] must be a table"),
    ],
)
def test_unknown_sections_and_keys_are_refused_with_a_suggestion(data, message):
    with pytest.raises(ConfigError, match=message):
        C.from_dict(data)


def test_an_unknown_key_in_set_gets_a_suggestion():
    with pytest.raises(ConfigError, match=r"did you mean 'max_staleness'"):
        with_sets("staleness.max_stalenes=3")
    with pytest.raises(ConfigError, match=r"did you mean 'staleness'"):
        with_sets("stalenes.max_staleness=3")


def test_an_abbreviation_is_suggested_before_a_merely_similar_name():
    with pytest.raises(ConfigError, match=r"train.learning_rate \(did you mean 'lr'\?\)"):
        with_sets("train.learning_rate=1e-3")


def test_an_unknown_key_in_a_file_gets_a_suggestion(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[train]\nprompt_per_step = 4\n")
    with pytest.raises(ConfigError, match=r"did you mean 'prompts_per_step'"):
        C.load(path)


# ---------------------------------------------------------------------------------------------
# Validation: every message of the sections' problems() is reachable and names its key

# (overrides, a fragment of exactly one message, the key that message must name)
PROBLEMS = [
    (["sampling.group_size=1"], "GRPO needs G >= 2", "sampling.group_size"),
    (["sampling.temperature=0"], "temperature must be finite and > 0", "sampling.temperature"),
    (["sampling.top_p=0"], "must be in (0, 1] (1 = off)", "sampling.top_p"),
    (["sampling.top_k=-1"], "must be >= 0 (0 = off)", "sampling.top_k"),
    (["sampling.min_p=1"], "must be in [0, 1) (0 = off)", "sampling.min_p"),
    (["sampling.max_kept=0"], "must be in [1, 256]", "sampling.max_kept"),
    (["sampling.max_kept=257"], "must be in [1, 256]", "sampling.max_kept"),
    (["sampling.top_k=300"], "every kept set travels whole", "sampling.top_k"),
    (["sampling.max_new_tokens=0"], "max_new_tokens must be >= 1", "sampling.max_new_tokens"),
    (["staleness.max_staleness=-1"], "max_staleness must be >= 0", "staleness.max_staleness"),
    (["staleness.publish_every=0"], "publish_every must be >= 1", "staleness.publish_every"),
    (["staleness.publish_every=4"], "= 4 > max_staleness + 1 = 3", "staleness.publish_every"),
    (["train.prompts_per_step=0"], "prompts_per_step must be >= 1", "train.prompts_per_step"),
    (["train.lr=0"], "lr must be > 0", "train.lr"),
    (["train.warmup_steps=-1"], "warmup_steps must be >= 0", "train.warmup_steps"),
    (["train.lr_min_ratio=1.5"], "lr_min_ratio must be in [0, 1]", "train.lr_min_ratio"),
    (["train.micro_batch_tokens=0"], "micro_batch_tokens must be", "train.micro_batch_tokens"),
    (["train.updates_per_batch=0"], "updates_per_batch must be", "train.updates_per_batch"),
    (["train.logprob_chunk_mib=0"], "logprob_chunk_mib must be > 0", "train.logprob_chunk_mib"),
    (["train.betas=[0.9, 1.0]"], "betas must be two numbers", "train.betas"),
    (["run.steps=-1"], "steps must be >= 0", "run.steps"),
    (["loss.clip_low=1.0"], "clip_low must be in [0, 1)", "loss.clip_low"),
    (["loss.dual_clip=0.5"], "dual_clip must be 0 (off) or > 1", "loss.dual_clip"),
    (["loss.tis_cap_min=2.0"], "tis_cap must be > 0 and > loss.tis_cap_min", "loss.tis_cap"),
    (["loss.beta=-0.1"], "beta must be >= 0", "loss.beta"),
    (["loss.objective=cispo", "loss.dual_clip=3"], "has none (set dual_clip = 0)",
     "loss.dual_clip"),
    (["loss.objective=gmpo", "loss.ratio_level=sequence"], "clipping the sequence's geometric",
     "loss.objective"),
    (["loss.adv_baseline=group-whiten"], "divides by the batch's std itself", "loss.adv_scale"),
    (["loss.overlong_window=-1"], "overlong_window must be >= 0", "loss.overlong_window"),
    (["loss.overlong_penalty=-1"], "overlong_penalty must be finite", "loss.overlong_penalty"),
    (["task.source=jsonl"], "required when task.source = 'jsonl'", "task.path"),
    (['task.prompt_field=""'], "prompt_field must name a column", "task.prompt_field"),
    (["task.answer_field=prompt"], "must name different columns", "task.answer_field"),
    (["task.max_row_kib=0"], "max_row_kib must be > 0", "task.max_row_kib"),
    (["rewards.fns=[]"], "needs at least one reward", "rewards.fns"),
    (["rewards.workers=0"], "rewards.workers >= 1", "rewards.timeout_s"),
    (["snapshot.keep_last=0"], "keep_last must be >= 1", "snapshot.keep_last"),
    (["snapshot.fanout=0"], "fanout must be >= 1", "snapshot.fanout"),
    (["snapshot.anchor_every=-1"], "anchor_every must be >= 0", "snapshot.anchor_every"),
    (['log.report_to=["mlflow"]'], "['mlflow'] unknown", "log.report_to"),
    (['log.report_to=["wandb", "wandb"]'], "names one twice", "log.report_to"),
    (["log.completions_every=-1"], "completions_every must be >= 0", "log.completions_every"),
    (["log.completions_groups=0"], "completions_groups must be >= 1", "log.completions_groups"),
    (["snapshot.delta_max_ratio=0"], "must be in (0, 1]", "snapshot.delta_max_ratio"),
    (["net.heartbeat_s=20"], "must exceed two heartbeats", "net.producer_timeout_s"),
    (["net.max_heartbeats_per_s=0"], "must be > 0", "net.max_heartbeats_per_s"),
    (["net.max_message_mib=0"], "max_message_mib must be > 0", "net.max_message_mib"),
    (["net.lease_wait_s=6"], "lease_wait_s must be in [0, 5]", "net.lease_wait_s"),
    (["net.max_queued_mib=32"], "largest group could never be admitted", "net.max_queued_mib"),
    (["net.max_queued_groups=0"], "max_queued_groups must be >= 1", "net.max_queued_groups"),
    (["net.consumer_timeout_s=1"], "or exceed two heartbeats", "net.consumer_timeout_s"),
    (["net.bind_host=0.0.0.0"], "is not a loopback address", "net.bind_host"),
    (["net.connect=tcp://10.0.0.2:5555"], "leaves this machine", "net.connect"),
    (["net.connect=127.0.0.1:5555"], "not an endpoint tcp://HOST:PORT", "net.connect"),
    (["producer.max_in_flight=0"], "max_in_flight must be >= 1", "producer.max_in_flight"),
    (["run.wait_for_producers=-1"], "wait_for_producers_s must be >= 0", "run.wait_for_producers"),
    (["run.no_signal_s=-1"], "no_signal_s must be >= 0", "run.no_signal_s"),
    (["fake.min_tokens=0"], "min_tokens must be in [1, fake.max_tokens]", "fake.min_tokens"),
    (["dist.timeout_s=0"], "timeout_s must be > 0", "dist.timeout_s"),
    (["eval.every_steps=-1"], "every_steps must be >= 0 (0 = off)", "eval.every_steps"),
    (
        ["eval.learner_every_steps=-1"],
        "learner_every_steps must be >= 0",
        "eval.learner_every_steps",
    ),
    (["eval.learner_prompts=0"], "learner_prompts must be >= 1", "eval.learner_prompts"),
    (["eval.final_wait_s=-1"], "final_wait_s must be >= 0", "eval.final_wait_s"),
    (["eval.samples_per_prompt=0"], "must be in [1, 256]", "eval.samples_per_prompt"),
    (["eval.samples_per_prompt=257"], "must be in [1, 256]", "eval.samples_per_prompt"),
    (["eval.temperature=-1"], "finite and >= 0 (0 = greedy)", "eval.temperature"),
    (["eval.temperature=0", "eval.samples_per_prompt=4"], "gives k equal completions",
     "eval.samples_per_prompt"),
    (["eval.max_prompts=0"], "max_prompts must be >= 1", "eval.max_prompts"),
    (["eval.pass_reward=inf"], "pass_reward must be finite", "eval.pass_reward"),
    (["eval.every_steps=5", "task.source=jsonl", "task.path=x.jsonl"],
     "has no held-out split", "eval.path"),
    (["episodes.max_turns=0"], "episodes.max_turns must be >= 1", "episodes.max_turns"),
    (["episodes.max_episode_tokens=0"], "episodes.max_episode_tokens must be >= 1",
     "episodes.max_episode_tokens"),
    (["episodes.timeout_s=nan"], "episodes.timeout_s must be > 0", "episodes.timeout_s"),
    (["episodes.workers=0"], "episodes.workers must be >= 1", "episodes.workers"),
    (["episodes.latency_s=-1"], "episodes.latency_s must be >= 0", "episodes.latency_s"),
    (["episodes.latency_alpha=1"], "a finite mean latency", "episodes.latency_alpha"),
]  # fmt: skip


@pytest.mark.parametrize(("sets", "fragment", "key"), PROBLEMS, ids=[p[1] for p in PROBLEMS])
def test_each_impossible_setting_is_refused_naming_its_key(sets, fragment, key):
    found = [m for m in C.problems(with_sets(*sets)) if fragment in m]
    assert len(found) == 1
    assert key in found[0]
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        C.load(None, sets)


def test_every_check_in_problems_has_a_case():
    # One `(holds, message)` argument of `failed(...)` per check, in each section's problems():
    # a new check needs a new row in PROBLEMS.
    num_checks = 0
    for cls in C._section_types().values():
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls.problems)))
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        num_checks += sum(len(n.args) for n in calls if getattr(n.func, "id", "") == "failed")
    assert len({fragment for _, fragment, _ in PROBLEMS}) == num_checks


def test_an_overlong_window_past_the_completion_limit_is_refused():
    found = [m for m in C.problems(with_sets("loss.overlong_window=17")) if "overlong" in m]
    assert found == [
        "loss.overlong_window = 17 > sampling.max_new_tokens = 16: the window is the last "
        "tokens before the limit"
    ]
    assert not C.problems(with_sets("loss.overlong_window=16"))


def test_problems_are_gathered_from_every_section_once():
    assert sorted(C.CHECK_ORDER) == sorted(C.SECTIONS)


@pytest.mark.parametrize(
    "sets",
    [
        ["sampling.group_size=1", "sampling.group_size=2"],
        ["staleness.publish_every=3"],  # == max_staleness + 1
        ["staleness.max_staleness=0", "staleness.publish_every=1"],
        ["net.bind_host=0.0.0.0", "net.keys_dir=keys"],
        ["net.bind_host=0.0.0.0", "net.insecure=true"],
        ["net.bind_host=localhost"],
        ["net.bind_host=127.0.0.2"],
        ["net.bind_host=::1"],
        ["net.connect=tcp://10.0.0.2:5555", "net.keys_dir=keys"],
        ["net.connect=tcp://10.0.0.2:5555", "net.insecure=true"],
        ["net.connect=tcp://localhost:5555"],
        ["net.connect=tcp://[::1]:5555"],
        ["task.source=jsonl", "task.path=prompts.jsonl"],
        ["loss.dual_clip=3.0"],
        ["fake.min_tokens=16", "fake.max_tokens=16"],
        ["sampling.top_p=0.9", "sampling.top_k=256", "sampling.min_p=0.99"],
        ["sampling.top_p=1e-9", "sampling.max_kept=1", "sampling.top_k=1"],
    ],
)
def test_a_possible_setting_near_a_limit_is_accepted(sets):
    assert C.problems(with_sets(*sets)) == []


@pytest.mark.parametrize(
    ("sets", "keys"),
    [
        (["sampling.temperature=inf"], ["sampling.temperature"]),  # the wire refuses it
        (["sampling.temperature=nan"], ["sampling.temperature"]),
        *[([f"sampling.top_p={v}"], ["sampling.top_p"]) for v in ("nan", "1.5")],
        (["net.bind_host=0.0.0.0", "net.connect=tcp://10.0.0.2:5555"], ["bind_host", "connect"]),
        (["net.bind_host=*"], ["bind_host"]),
        (["fake.min_tokens=17"], ["fake.min_tokens"]),
        (["train.betas=[0.9]"], ["train.betas"]),
        (["loss.tis_cap=0"], ["loss.tis_cap"]),
        (["loss.clip_high=-0.1"], ["loss.clip_low"]),
        (["rewards.timeout_s=0"], ["rewards.timeout_s"]),
        (["net.heartbeat_s=0"], ["net.heartbeat_s"]),
        (["sampling.group_size=0", "train.lr=0"], ["sampling.group_size", "train.lr"]),
    ],
)
def test_problems_lists_every_problem_not_only_the_first(sets, keys):
    found = C.problems(with_sets(*sets))
    assert len(found) == len(keys)
    for message, key in zip(found, keys, strict=True):
        assert key in message


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("127.0.0.1:5555", "did you mean 'tcp://127.0.0.1:5555'?"),
        ("learner", "did you mean 'tcp://learner:5555'?"),
        ("ipc:///tmp/asyncgrpo.sock", "only tcp:// endpoints are supported, not ipc://"),
        ("tcp://10.0.0.1", "a host, then a port in 1-65535"),
        ("tcp://:5555", "a host, then a port in 1-65535"),
        ("tcp://host:70000", "a host, then a port in 1-65535"),
    ],
)
def test_a_connect_endpoint_that_is_not_tcp_host_port_is_refused_with_the_fix(endpoint, why):
    found = C.problems(with_sets(f"net.connect={endpoint}", "net.insecure=true"))
    shown = why if why.startswith("only") else f"not an endpoint tcp://HOST:PORT ({why})"
    assert found == [f"net.connect = {endpoint!r}: {shown}"]


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("localhost", True),
     ("0.0.0.0", False), ("10.0.0.1", False), ("*", False), ("example.com", False), ("", False)],
)  # fmt: skip
def test_is_loopback(host, loopback):
    assert C.is_loopback(host) is loopback


# ---------------------------------------------------------------------------------------------
# Writing and help


def test_to_toml_then_load_round_trips_exactly(tmp_path):
    cfg = with_sets(
        'run.dir=runs/ünï "quoted"',
        "run.seed=123",
        "sampling.temperature=0.7",
        "train.lr=1e-7",
        "train.betas=[0.9, 0.95]",
        'rewards.fns=[{fn = "math_verify", weight = 0.25}, {fn = "m:f", weight = 3}]',
        "loss.agg=seq-mean-token-sum-norm",
        "net.insecure=true",
        "net.bind_host=0.0.0.0",
        "producer.engine=fake",
    )
    path = tmp_path / "config.toml"
    C.write(cfg, path)
    assert C.load(path) == cfg
    assert C.from_dict(tomllib.loads(C.to_toml(cfg))) == cfg


def test_defaults_round_trip_through_toml(tmp_path):
    path = tmp_path / "config.toml"
    C.write(C.Config(), path)
    assert C.load(path) == C.Config()


def test_field_help_covers_every_field_with_help_text():
    rows = C.field_help()
    assert [key for key, *_ in rows] == all_keys()
    defaults = C.Config()
    for key, tname, default, help_text in rows:
        value: object = defaults
        for part in key.split("."):
            value = getattr(value, part)
        assert help_text.strip(), key
        assert tname
        assert default == value


def test_field_help_lists_the_choices():
    rows = {key: help_text for key, _, _, help_text in C.field_help()}
    assert rows["model.dtype"].endswith("One of: float32, bfloat16.")
    assert rows["producer.engine"].endswith("One of: hf, vllm, fake.")


def test_every_field_has_a_simple_type_and_a_default_of_that_type():
    for name, cls in C._section_types().items():
        hints = typing.get_type_hints(cls)
        instance = cls()
        for f in dataclasses.fields(cls):
            tp = hints[f.name]
            value = getattr(instance, f.name)
            if C.choices(tp):  # a mode: a Literal of strings, declared once (config/fields.py)
                assert value in C.choices(tp), f"{name}.{f.name}"
                continue
            expected = typing.get_origin(tp) or tp
            assert isinstance(value, expected), f"{name}.{f.name}"


def test_list_defaults_are_not_shared_between_instances():
    a, b = C.Config(), C.Config()
    assert a.train.betas == b.train.betas
    assert a.train.betas is not b.train.betas
    assert a.rewards.fns is not b.rewards.fns


# ---------------------------------------------------------------------------------------------
# Typed overrides (what flags and code use: values, never TOML text)

QUOTED = 'runs/it\'s "quoted" \\ dir'


def test_override_sets_typed_values_and_paths_as_written(tmp_path):
    cfg = C.override(
        C.Config(),
        {"run.dir": Path(QUOTED), "run.steps": 7, "loss.tis_mode": "mask", "net.insecure": True},
    )
    assert cfg.run.dir == QUOTED
    assert (cfg.run.steps, cfg.loss.tis_mode, cfg.net.insecure) == (7, "mask", True)
    path = tmp_path / "config.toml"
    C.write(cfg, path)
    assert C.load(path) == cfg  # and the quoted path survives the written config


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"run.steps": "7"}, "run.steps must be int, got '7'"),
        ({"run.steps": True}, "run.steps must be int, got True"),
        ({"loss.agg": "mean"}, "loss.agg = 'mean' is not one of 'token-mean'"),
        ({"net.insecure": "yes please"}, "net.insecure must be bool"),
        ({"sampling.group_sise": 4}, r"did you mean 'group_size'"),
        ({"steps": 4}, "a config key is section.key"),
    ],
)
def test_override_refuses_what_a_toml_file_would_refuse(values, message):
    with pytest.raises(ConfigError, match=message):
        C.override(C.Config(), values)


def test_typed_values_come_after_the_file_and_set_overrides(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[run]\ndir = "from-file"\nsteps = 3\n')
    cfg = C.load(path, ["run.dir=from-set"], {"run.dir": QUOTED})
    assert (cfg.run.dir, cfg.run.steps) == (QUOTED, 3)


def test_every_mode_is_declared_once_as_a_literal_and_listed_as_the_choices():
    rows = {key: help_text for key, _, _, help_text in C.field_help()}
    assert rows["loss.agg"].endswith("One of: " + ", ".join(C.choices(C.AggMode)) + ".")
    assert C.choices(C.TISMode) == ("truncate", "mask")
    assert C.choices(str) == ()


def test_load_given_names_the_keys_of_the_file_the_sets_and_the_values(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[run]\nsteps = 3\n[[rewards.fns]]\nfn = "exact_match"\n')
    loaded = C.load_given(path, [" sampling.group_size = 4"], {"run.dir": "x"})
    assert loaded.config == C.load(path, [" sampling.group_size = 4"], {"run.dir": "x"})
    assert loaded.given == {"run.steps", "rewards.fns", "sampling.group_size", "run.dir"}


def test_a_fallback_files_keys_are_defaults_not_given(tmp_path):
    fallback = tmp_path / "demo.toml"
    fallback.write_text("[run]\nsteps = 3\n")
    loaded = C.load_given(None, ["run.seed=1"], fallback=fallback)
    assert (loaded.config.run.steps, loaded.config.run.seed) == (3, 1)
    assert loaded.given == {"run.seed"}
    mine = tmp_path / "mine.toml"
    mine.write_text("[train]\nlr = 0.1\n")
    loaded = C.load_given(mine, fallback=fallback)  # the user's file replaces the fallback
    assert (loaded.config.run.steps, loaded.given) == (C.RunConfig().steps, {"train.lr"})


# -- keys that moved -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("old", "value", "new"),
    [
        ("train.eval_every", 10, "eval.learner_every_steps"),
        ("train.eval_size", 50, "eval.learner_prompts"),
        ("task.eval_path", "/data/held.jsonl", "eval.path"),
        ("task.eval_split", "validation", "eval.split"),
        ("task.eval_mode", "sampled", "eval.mode"),
    ],
)
def test_a_moved_key_is_read_as_its_new_name_with_one_deprecation_line(
    old, value, new, tmp_path, caplog
):
    section, key = old.split(".")
    shown = f'"{value}"' if isinstance(value, str) else str(value)
    path = tmp_path / "old.toml"
    path.write_text(f"[{section}]\n{key} = {shown}\n")
    with caplog.at_level(logging.WARNING, logger="asyncgrpo.config"):
        from_file = C.load_given(path)
        from_set = C.load(None, [f"{old}={shown}"])
    for cfg in (from_file.config, from_set):
        new_section, new_key = new.split(".")
        assert getattr(getattr(cfg, new_section), new_key) == value
    assert new in from_file.given
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert all(line.startswith(f"{old} is now {new}") for line in lines)


def test_a_moved_key_given_with_its_new_name_and_another_value_is_refused(tmp_path):
    path = tmp_path / "both.toml"
    path.write_text('[task]\neval_path = "/a.jsonl"\n[eval]\npath = "/b.jsonl"\n')
    with pytest.raises(ConfigError, match=r"task.eval_path is now eval.path: give only eval.path"):
        C.load(path)


def test_a_whole_config_written_before_the_keys_moved_still_loads(tmp_path, caplog):
    """A run's config.toml from before the move (`--resume`, `asyncgrpo eval RUN`) holds every
    old key, most at their defaults: those say nothing; the others move."""
    old = C.to_dict(C.Config())
    old["train"] |= {"eval_every": 10, "eval_size": 200}  # 200: the default, not said
    old["task"] |= {"eval_path": "", "eval_split": "test", "eval_mode": "greedy"}
    path = tmp_path / "config.toml"
    path.write_text(tomli_w.dumps(old))
    with caplog.at_level(logging.WARNING, logger="asyncgrpo.config"):
        cfg = C.load(path)
    assert (cfg.eval.learner_every_steps, cfg.eval.learner_prompts, cfg.eval.path) == (10, 200, "")
    assert [r.getMessage() for r in caplog.records] == [
        "train.eval_every is now eval.learner_every_steps: read as eval.learner_every_steps = 10 "
        "(rename it)"
    ]

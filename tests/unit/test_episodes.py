"""Multi-turn episodes in the producer: the contract, the calls, the built-in `guess`, the turns as
token deltas, the tools, and the episode loop (fake engine, environments called in-process)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from env_fixtures import multiply

from common import wire
from common.errors import ConfigError
from producer.engines.base import SamplingParams
from producer.engines.fake import FakeEngine
from producer.episodes import End, Reply
from producer.episodes import tools as T
from producer.episodes.calls import EnvCall, call_env, resolve_env
from producer.episodes.contract import Next, normalise
from producer.episodes.guess import DISCOUNT, guess, hint
from producer.episodes.loop import Episode, run_episodes, score_episodes
from producer.episodes.render import TurnRenderer
from producer.episodes.runner import EnvRunner, latency_s
from producer.groups import group_of
from producer.rewards.scoring import FakeRewards, GroupScore
from producer.tokenizer import PromptCodec

VOCAB = 64


def spec(env: str = "env_fixtures:echo", **changes: object) -> wire.EpisodeSpec:
    base = wire.EpisodeSpec(
        env=env,
        max_turns=3,
        max_episode_tokens=512,
        timeout_s=5.0,
        latency_s=0.0,
        latency_alpha=1.5,
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def call(text: str = "042", *, turn: int = 1, turns_left: int = 2, **changes: object) -> EnvCall:
    base = EnvCall(
        reply=Reply(text, (1, 2), "stop"),
        messages=[{"role": "assistant", "content": text}],
        turn=turn,
        turns_left=turns_left,
        state={},
        prompt="07+45=",
        answer="052",
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


# -- the contract --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("hi", Next((("user", "hi"),))),
        ({"role": "tool", "content": "42"}, Next((("tool", "42"),))),
        (
            [{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}],
            Next((("user", "a"), ("tool", "b"))),
        ),
        (End(), End()),
        (End(1), End(1.0)),
    ],
)
def test_what_an_environment_may_return(value, expected):
    assert normalise(value) == expected


@pytest.mark.parametrize(
    ("value", "said"),
    [
        (3.0, "returned 3.0 (float)"),
        ([], "returned [] (list)"),
        ([{"role": "user", "content": 5}], "without a role and a string content"),
        ([{"role": "", "content": "x"}], "without a role and a string content"),
        (["text"], "holding str, not message dicts"),
        (End(float("inf")), "a reward that is not finite"),
        (End(True), "whose reward is not a number"),  # type: ignore[arg-type]
        (None, "returned None"),
    ],
)
def test_anything_else_is_refused_with_a_reason(value, said):
    why = normalise(value)
    assert isinstance(why, str)
    assert said in why


# -- the built-in guess ---------------------------------------------------------------------------
def test_guess_rewards_the_right_answer_with_a_discount_per_turn():
    assert guess(Reply(" 052 ", (), "stop"), "052", "07+45=", 1, 2) == End(1.0)
    assert guess(Reply("052", (), "stop"), "052", "07+45=", 3, 0) == End(DISCOUNT**2)
    assert guess(Reply("042", (), "stop"), "052", "07+45=", 3, 0) == End(0.0)


def test_guess_answers_a_wrong_answer_with_a_hint_and_the_problem():
    assert guess(Reply("042", (), "stop"), "052", "07+45=", 1, 2) == "+ 07+45="
    assert guess(Reply("99", (), "length"), "052", "07+45=", 2, 1) == "- 07+45="
    assert hint("0a", "052") == "*"
    chat = [{"role": "system", "content": "s"}, {"role": "user", "content": "07+45="}]
    assert guess(Reply("042", (), "stop"), "052", chat, 1, 2) == "+ 07+45="


# -- one call ----------------------------------------------------------------------------------
def test_a_call_gives_arguments_by_name_and_keeps_the_state():
    out = call_env("env_fixtures:echo", call(turn=1), None)
    assert out.kind == "next"
    assert out.result == Next((("user", "turn 1"),))
    assert out.state == {"seen": 1}
    out = call_env("env_fixtures:echo", call(turn=2, state=out.state), None)
    assert out.state == {"seen": 2}
    out = call_env("env_fixtures:echo", call(turn=3, state=out.state), None)
    assert (out.kind, out.result) == ("end", End(0.3))


def test_a_call_reads_the_rows_columns_and_awaits_async_environments():
    row = call("7", columns='{"target": "7", "bonus": 0.5}')
    assert call_env("env_fixtures:by_column", row, 5.0).result == End(1.5)
    out = call_env("env_fixtures:by_column", call("7"), 5.0)
    assert out.kind == "error"
    assert "takes 'target'" in out.why
    assert call_env("env_fixtures:slow_async", call(turn=2), 5.0).result == End(1.0)


@pytest.mark.parametrize(
    ("env", "kind", "said"),
    [
        ("env_fixtures:raises", "error", "raised RuntimeError: this environment is broken"),
        ("env_fixtures:returns_number", "bad_return", "returned 3.0"),
        ("env_fixtures:returns_nothing", "bad_return", "returned []"),
        ("env_fixtures:returns_bad_message", "bad_return", "string content"),
        ("env_fixtures:nan_reward", "bad_return", "not finite"),
    ],
)
def test_a_bad_call_is_an_outcome_with_its_reason_never_an_exception(env, kind, said):
    out = call_env(env, call(), 0.2)
    assert out.kind == kind
    assert said in out.why


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ("nope", "unknown environment 'nope'"),
        ("env_fixtures:missing", "cannot import 'env_fixtures:missing'"),
        ("no_such_module_x:fn", "cannot import"),
    ],
)
def test_an_environment_that_cannot_be_found_fails_at_start_naming_the_key(env, said):
    with pytest.raises(ConfigError) as info:
        resolve_env(env)
    assert "episodes.env" in str(info.value)
    assert said in str(info.value)


# -- the turns as token deltas --------------------------------------------------------------
def test_without_a_template_a_delta_is_the_messages_text_alone(demo_codec: PromptCodec):
    renderer = TurnRenderer(demo_codec)
    ids, chat = renderer.opening("07+45=")
    assert not chat
    assert ids == demo_codec.encode("07+45=")
    delta = renderer.delta([("user", "+ 07+45=")], after=[5, 6, 1], chat=False)
    assert demo_codec.tokenizer.decode(delta) == "+ 07+45="


def test_a_chat_delta_completes_the_turn_then_renders_the_new_messages(chat_codec: PromptCodec):
    renderer = TurnRenderer(chat_codec)
    tok = chat_codec.tokenizer
    ids, chat = renderer.opening("What is 2+2?")
    assert chat
    assert ids == chat_codec.encode("What is 2+2?")
    end = tok.convert_tokens_to_ids("<|im_end|>")
    msg = [("user", "too high")]
    stopped = renderer.delta(msg, after=[40, end], chat=True)
    assert tok.decode(stopped) == "\n<|im_start|>user\ntoo high<|im_end|>\n<|im_start|>assistant\n"
    cut = renderer.delta(msg, after=[40, 41], chat=True)  # max_new_tokens: the end token too
    assert tok.decode(cut) == "<|im_end|>" + tok.decode(stopped)
    # what the template renders for the whole conversation follows the turn's own ids
    text = tok.decode([*ids, 40, end, *stopped])
    whole = tok.apply_chat_template(
        [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": tok.decode([40])},
            {"role": "user", "content": "too high"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == whole


def test_a_template_that_rewrites_earlier_turns_is_refused_at_start(tmp_path: Path, chat_codec):
    tok = chat_codec.tokenizer
    # renders only the last user message: adding one changes the text before it
    tok.chat_template = (
        "{% for m in messages %}{% if loop.last %}{{ m['content'] }}{% endif %}{% endfor %}"
    )
    try:
        with pytest.raises(ConfigError) as info:
            TurnRenderer(chat_codec)
    finally:
        tok.chat_template = _CHATML
    assert "cannot be extended turn by turn" in str(info.value) or "drops" in str(info.value)


# -- tools --------------------------------------------------------------------------------------
def test_tool_calls_are_parsed_dispatched_and_their_errors_answered():
    text = (
        'Let me compute. <tool_call>{"name": "multiply", "arguments": {"a": 123, "b": 456}}'
        '</tool_call> and <tool_call>{"name": "divide", "arguments": {}}</tool_call>'
        "<tool_call>not json</tool_call>"
    )
    assert T.tool_calls(text)[0] == ("multiply", {"a": 123, "b": 456})
    results = T.dispatch(text, [multiply])
    assert results is not None
    assert next(r["content"] for r in results) == "56088"
    assert results[1]["content"].startswith("error: no tool 'divide'")
    assert results[2]["content"].startswith("error: not a tool call")
    assert all(r["role"] == "tool" for r in results)
    bad = T.dispatch('<tool_call>{"name": "multiply", "arguments": {"a": 1}}', [multiply])
    assert bad is not None
    assert bad[0]["content"].startswith("error: TypeError")
    assert T.dispatch("no call here", [multiply]) is None


def test_the_python_tool_runs_the_models_code_in_the_sandbox_and_answers_its_failure():
    call = '<tool_call>{"name": "python", "arguments": {"code": "%s"}}</tool_call>'
    ok = T.dispatch(call % "print(sum(range(10)) * 7)", [T.python])
    assert ok == [{"role": "tool", "content": "315\n"}]
    failed = T.dispatch(call % "import sys; sys.exit('no luck')", [T.python])
    assert failed is not None
    assert failed[0]["content"] == "error (error): no luck"
    assert "- python(code: str) -> str: Run a Python program" in T.describe([T.python])


def test_tools_are_described_in_the_plain_format_when_the_template_takes_none(chat_codec):
    renderer = TurnRenderer(chat_codec, tools=[multiply])
    ids, chat = renderer.opening("What is 123 * 456?")
    text = chat_codec.tokenizer.decode(ids)
    assert chat
    assert "<|im_start|>system\nYou can call these tools." in text
    assert "- multiply(a: int, b: int) -> int: Multiply two integers." in text
    assert text.endswith("<|im_start|>user\nWhat is 123 * 456?<|im_end|>\n<|im_start|>assistant\n")


# -- the loop ------------------------------------------------------------------------------------
def _loop(env_spec: wire.EpisodeSpec, *, n: int = 4, max_new: int = 6, seed: int = 3):
    codec = PromptCodec(None, "raw", vocab_size=VOCAB)
    engine = FakeEngine(
        vocab_size=VOCAB, eos_token_id=VOCAB - 1, seed=1, min_tokens=2, max_tokens=max_new
    )
    runner = EnvRunner(env_spec, workers=1, inline=True)
    counts: dict[str, float] = {}
    lease = wire.Lease(7, 9, 0, 0, "07+45=", "052", (), "")
    params = SamplingParams(
        n=n, temperature=1.0, max_new_tokens=max_new, seed=seed, stop_token_ids=(VOCAB - 1,)
    )

    def count(key: str, value: float) -> None:
        counts[key] = counts.get(key, 0) + value

    async def main() -> tuple[list[int], list[Episode]]:
        await engine.load_weights(Path("."), 2)
        return await run_episodes(
            engine,
            TurnRenderer(codec),
            runner,
            lease=lease,
            spec=env_spec,
            params=params,
            count=count,
        )

    prompt, episodes = asyncio.run(main())
    return codec, lease, prompt, episodes, counts, runner


def test_episodes_alternate_sampled_turns_and_inserted_messages():
    codec, _lease, prompt, episodes, counts, _ = _loop(spec())
    assert prompt == codec.encode("07+45=")
    assert len(episodes) == 4
    for e in episodes:
        assert (e.turns, e.finish_reason, e.reward) == (3, "stop", 0.3)
        assert len(e.logprobs) == len(e.versions) == int(e.sampled.sum())
        assert e.sampled[0]  # an episode starts with the model
        inserted = e.token_ids[~e.sampled]
        assert inserted.tolist() == codec.encode("turn 1") + codec.encode("turn 2")
        assert [m["role"] for m in e.messages] == ["user", "assistant"] * 3
    assert counts == {"episodes": 4, "episode_turns": 12}


def test_the_same_lease_seed_samples_the_same_episodes():
    a = _loop(spec())[3]
    b = _loop(spec())[3]
    assert all(np.array_equal(x.token_ids, y.token_ids) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    ("env", "changes", "finish", "reward"),
    [
        ("env_fixtures:chatty", {"max_turns": 2}, "max_turns", None),
        ("env_fixtures:leaves_reward", {}, "stop", None),
        ("env_fixtures:raises_on_turn_2", {}, "env_error", None),
        ("env_fixtures:floods", {}, "max_tokens", None),
        ("env_fixtures:echo", {"max_episode_tokens": 14}, "max_tokens", None),
    ],
)
def test_how_an_episode_ends(env, changes, finish, reward):
    _, _, _, episodes, counts, runner = _loop(spec(env, **changes), max_new=4)
    assert {e.finish_reason for e in episodes} == {finish}
    assert {e.reward for e in episodes} == {reward}
    for e in episodes:
        assert len(e.token_ids) <= spec(env, **changes).max_episode_tokens
        if finish == "env_error":
            assert e.turns == 2
    if finish == "max_tokens":
        assert counts["episodes_over_budget"] == 4
    if finish == "env_error":
        assert runner.counters["env_errors"] == runner.counters["env_raised"] == 4


def test_a_failed_episode_scores_0_and_the_rest_go_to_the_reward_functions():
    _, lease, _, episodes, _, _ = _loop(spec("env_fixtures:leaves_reward"))
    failed = dataclasses.replace(episodes[0], finish_reason="env_error", reward=None)
    mixed = [failed, episodes[1], dataclasses.replace(episodes[2], reward=0.5), episodes[3]]
    scored = asyncio.run(score_episodes(FakeRewards(run_seed=0, p=1.0), lease, mixed))
    assert scored.rewards.tolist() == [0.0, 1.0, 0.5, 1.0]
    assert scored.parts.size == 0  # the functions did not score every episode


def test_an_episode_group_goes_through_the_wire_with_its_bits():
    _, lease, prompt, episodes, _, _ = _loop(spec())
    scored = GroupScore(np.array([e.reward for e in episodes], np.float32), 0)
    g = group_of("p0", lease, prompt, episodes, scored, temperature=1.0, gen_s=0.5)
    limits = wire.Limits(vocab_size=VOCAB, group_size=4, temperature=1.0, max_completion_tokens=512)
    back = wire.decode(wire.encode(g), limits)
    assert back.episodes
    assert back.num_sampled == sum(int(e.sampled.sum()) for e in episodes)
    for i, e in enumerate(episodes):
        ids, logp = back.completion(i)
        assert ids.tolist() == e.token_ids.tolist()
        assert logp.tolist() == e.logprobs.tolist()
        assert back.completion_sampled(i).tolist() == e.sampled.tolist()
    assert back.finish_reasons == ("stop",) * 4


def test_simulated_latency_is_a_seeded_pareto_draw():
    s = spec(latency_s=0.01, latency_alpha=1.5)
    draws = [latency_s(s, seed) for seed in range(4000)]
    assert draws == [latency_s(s, seed) for seed in range(4000)]
    assert min(draws) >= 0.01
    assert np.mean(draws) == pytest.approx(0.03, rel=0.3)  # latency_s * alpha / (alpha - 1)
    assert max(draws) > 20 * np.median(draws)  # a heavy tail
    assert latency_s(spec(), 1) == 0.0


# -- fixtures --------------------------------------------------------------------------------------
_CHATML = ""


@pytest.fixture(scope="module")
def chat_codec(tmp_path_factory: pytest.TempPathFactory) -> PromptCodec:
    global _CHATML
    from tiny_models import build_chat_model

    out = build_chat_model(tmp_path_factory.mktemp("chat"))
    codec = PromptCodec(out, "chat", vocab_size=320)
    _CHATML = codec.tokenizer.chat_template
    return codec


@pytest.fixture(scope="module")
def demo_codec(tmp_path_factory: pytest.TempPathFactory) -> PromptCodec:
    from launch.demo_model import make_tokenizer

    out = tmp_path_factory.mktemp("demo-tok")
    make_tokenizer().save_pretrained(out)
    return PromptCodec(out, "raw", vocab_size=18)


# -- the SmolLM2 calculator example (docs/episodes/) ---------------------------------------------
def _calculator_example():
    import importlib.util

    path = Path(__file__).parents[2] / "docs" / "episodes" / "calculator.py"
    spec = importlib.util.spec_from_file_location("calculator_example", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path.parent


def test_the_calculator_examples_rows_are_what_its_script_writes_and_its_environment_scores():
    calc, here = _calculator_example()
    train, heldout = calc.rows()
    for name, part in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        assert (here / name).read_text() == "".join(json.dumps(r) + "\n" for r in part)
    questions = {r["messages"][1]["content"] for r in train}
    assert not questions & {r["messages"][1]["content"] for r in heldout}
    reply = lambda text: Reply(text, (), "stop")  # noqa: E731
    assert calc.calculator(reply("Let me compute 964 * 494."), "476216", 2) == {
        "role": "tool",
        "content": "964 * 494 = 476216",
    }
    assert calc.calculator(reply("476,216"), "476216", 1) == End(1.0)
    assert calc.calculator(reply("476000"), "476216", 1) == End(0.0)
    assert calc.calculator(reply("964 * 494"), "476216", 0) == End(0.0)

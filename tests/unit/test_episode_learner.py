"""Episodes at the learner: only sampled tokens are trained and counted, an episode its
environment failed is left out of the loss and of its group's advantages, and the step's episode
numbers (consumer/train/batching.py, loss.py, consumer/staleness.py, consumer/episode_tally.py,
completions.jsonl)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_wire_episodes import bits, episode_group

from common.files import completions_file as CF
from consumer.episode_tally import EpisodeTally
from consumer.reward_tally import RewardTally
from consumer.staleness import no_signal, verdict
from consumer.train import advantages as ADV
from consumer.train.batching import collate, loss_normalisers, rows_of, trained_NG


def test_only_sampled_tokens_are_on_the_mask_with_their_behaviour_logprobs():
    g = episode_group()  # [s s i i s] and [s i s] after a 3-token prompt
    rows = rows_of([g], np.array([[1.0, -1.0]]))
    assert [r.sampled_positions().tolist() for r in rows] == [[0, 1, 4], [0, 2]]
    mb = collate(rows, [0, 1], pad_id=0, device=torch.device("cpu"))
    # shifted frame: completion token j of a row sits at position prompt_len - 1 + j = 2 + j
    assert mb.mask_BT.nonzero().tolist() == [[0, 2], [0, 3], [0, 6], [1, 2], [1, 4]]
    assert mb.tokens_N.tolist() == [4, 5, 8, 9, 11]
    assert mb.behavior_logp_BT[0].tolist() == [0, 0, -0.5, -1.0, 0, 0, -2.0]
    assert mb.num_tokens == 5
    assert loss_normalisers(rows) == (5, 2)
    assert mb.input_ids_BL[0].tolist() == [1, 2, 3, 4, 5, 6, 7, 8]  # the forward sees all of it


def test_an_episode_its_environment_failed_is_not_trained_nor_counted():
    g = episode_group(finish_reasons=("env_error", "stop"))
    assert trained_NG([g]).tolist() == [[False, True]]
    rows = rows_of([g], np.zeros((1, 2)))
    assert len(rows) == 1
    assert rows[0].ids[3:].tolist() == [9, 10, 11]
    assert len(rows_of([g], np.zeros((1, 2)), all_episodes=True)) == 2


def test_advantages_leave_out_invalid_completions_and_equal_the_unmasked_when_all_valid():
    r = torch.tensor([[1.0, 0.0, 0.5, 0.0], [1.0, 1.0, 0.0, 1.0]], dtype=torch.float64)
    valid = torch.tensor([[True, False, True, True], [True, True, False, True]])
    tokens = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 10]])
    for baseline, scale in (
        ("group", "group"),
        ("group", "none"),
        ("group", "batch"),
        ("leave-one-out", "none"),
        ("group-whiten", "none"),
        ("batch-whiten", "none"),
    ):
        kw = {"baseline": baseline, "scale": scale, "tokens_NG": tokens}
        plain = ADV.group_advantages(r, **kw)  # type: ignore[arg-type]
        same = ADV.group_advantages(r, valid_NG=torch.ones_like(valid), **kw)  # type: ignore[arg-type]
        assert torch.equal(plain, same)
        masked = ADV.group_advantages(r, valid_NG=valid, **kw)  # type: ignore[arg-type]
        assert masked[~valid].eq(0).all(), baseline
    adv = ADV.group_advantages(r, scale="group", valid_NG=valid)
    sub = ADV.group_advantages(torch.tensor([[1.0, 0.5, 0.0]], dtype=torch.float64))
    assert adv[0, [0, 2, 3]].tolist() == pytest.approx(sub[0].tolist())
    assert adv[0, 1] == 0
    assert adv[1].tolist() == [0, 0, 0, 0]  # the valid ones are all equal: no signal
    loo = ADV.group_advantages(r, baseline="leave-one-out", scale="none", valid_NG=valid)
    sub = ADV.group_advantages(
        torch.tensor([[1.0, 0.5, 0.0]], dtype=torch.float64), baseline="leave-one-out", scale="none"
    )
    assert loo[0, [0, 2, 3]].tolist() == pytest.approx(sub[0].tolist())
    batch = ADV.group_advantages(r, scale="batch", valid_NG=valid)
    kept = r[valid]
    want = (1.0 - (1.0 + 0.5 + 0.0) / 3) / (kept.std(correction=1) + 1e-6)
    assert float(batch[0, 0]) == pytest.approx(float(want))
    whiten = ADV.group_advantages(
        r, baseline="batch-whiten", scale="none", tokens_NG=tokens, valid_NG=valid
    )
    n, a = tokens[valid].double(), r[valid]
    mu = (n * a).sum() / n.sum()
    var = (n * (a - mu) ** 2).sum() / (n.sum() - 1)
    assert whiten[valid].tolist() == pytest.approx(((a - mu) / (var + 1e-8).sqrt()).tolist())


def test_batch_advantages_count_an_episodes_sampled_tokens_and_leave_out_failed_ones():
    from consumer.train.batch_advantages import batch_advantages, sampled_per_completion

    g = episode_group(
        finish_reasons=("env_error", "stop"), rewards=np.array([1.0, 0.0], np.float32)
    )
    mask = g.sampled_mask()
    ends = np.cumsum(g.completion_lens)
    assert sampled_per_completion(g).tolist() == [
        int(mask[: ends[0]].sum()),
        int(mask[ends[0] :].sum()),
    ]
    for baseline, scale in (("group", "group"), ("batch-whiten", "none")):
        options = ADV.AdvantageOptions(baseline=baseline, scale=scale)  # type: ignore[arg-type]
        assert batch_advantages([g], options).tolist() == [[0.0, 0.0]]  # one valid: no signal


def test_a_group_with_fewer_than_two_trainable_episodes_has_no_signal():
    assert not no_signal(episode_group(rewards=np.array([1.0, 0.0], np.float32)))
    failed = episode_group(finish_reasons=("env_error", "stop"), rewards=np.array([1.0, 0.0]))
    assert no_signal(failed)
    assert verdict(failed, policy_version=2, max_staleness=0, drop_zero_variance=True) == (
        "dropped_zero_variance"
    )
    assert verdict(failed, policy_version=2, max_staleness=0, drop_zero_variance=False) is None


def test_the_steps_episode_numbers():
    tally = RewardTally([])
    tally.add(episode_group(env_s=0.5, finish_reasons=("stop", "env_error")))
    tally.add(episode_group(env_s=0.25))
    f = tally.fields()
    assert f["episode_turns_mean"] == 2.0
    assert f["episode_tokens_mean"] == 4.0
    assert f["episode_sampled_frac"] == 5 / 8
    assert f["env_s_mean"] == 0.75 / 4
    assert f["env_errors"] == 1
    assert f["episode_ends"] == {"stop": 2, "env_error": 1, "max_turns": 1}
    assert f["frac_reward_zero_std"] == 0.5  # one group left with a single trainable episode
    assert set(EpisodeTally().fields().values()) == {None}


def test_turns_count_the_runs_of_sampled_tokens():
    g = episode_group(
        completion_ids=np.arange(9, dtype=np.int32),
        completion_lens=np.array([6, 3], np.int32),
        sampled_bits=bits([1, 0, 1, 0, 1, 1, 1, 1, 1]),
        behavior_logp=np.full(7, -1.0, np.float32),
    )
    assert g.turns().tolist() == [3, 1]


def test_completions_show_whole_episodes_with_the_environments_tokens_marked():
    rows = CF.rows_of(
        [episode_group()],
        step=4,
        decode=lambda ids: "".join(chr(97 + i) for i in ids),
        reward_names=[],
    )
    assert [r.completion for r in rows] == ["ef⟦gh⟧i", "j⟦k⟧l"]
    assert [(r.turns, r.sampled, r.length) for r in rows] == [(2, 3, 5), (2, 2, 3)]

"""Held-out evaluation in a child process (consumer/evaluation/child.py, a replay's evaluation):
the accuracy it reports is the one the same weights score in this process, results come back
by version, and a failing evaluation or a dead child is an error naming the version."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from common.errors import EvalError
from common.task.synthetic import make_examples
from consumer.evaluation.child import EvalProcess, EvalSpec
from consumer.evaluation.greedy import accuracy_of, load_model
from launch.demo_model import ensure_demo_model

SIZE, SEED, NEW = 24, 3, 4


def perturbed(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {k: v + scale * torch.randn(v.shape, generator=gen) for k, v in state.items()}


def test_the_child_scores_what_this_process_scores_and_its_failures_name_the_version():
    """The demo model (it adds, partly): two versions that score differently, both nonzero;
    then, in the same child, weights that do not fit, and the child killed."""
    model_dir = ensure_demo_model()
    model, tokenizer = load_model(model_dir)
    examples = make_examples("heldout", SIZE, seed=SEED)
    states = {4: perturbed(model.state_dict(), 0.0), 8: perturbed(model.state_dict(), 0.01)}
    expected = {}
    for v, state in states.items():
        model.load_state_dict(state)
        expected[v] = accuracy_of(model, tokenizer, examples, max_new_tokens=NEW).accuracy
    assert 0 < expected[8] != expected[4]  # the comparison below can tell the versions apart
    evals = EvalProcess(EvalSpec(str(model_dir), SIZE, SEED, NEW, every_steps=1))
    try:
        for v, state in states.items():
            evals.submit(v, state)
            state["model.norm.weight"].fill_(9.0)  # training goes on: the copy was taken
        assert evals.waiting == {4, 8}
        done = evals.drain()
        assert {v: r["heldout_accuracy"] for v, r in done.items()} == expected
        assert all(r["eval_s"] > 0 for r in done.values())
        assert evals.waiting == frozenset()

        evals.submit(3, {"model.norm.weight": torch.zeros(7)})  # not this model's weights
        with pytest.raises(EvalError, match=r"evaluation of version 3 failed: RuntimeError"):
            evals.drain()
        assert evals.pid is not None
        os.kill(evals.pid, signal.SIGKILL)
        evals.submit(5, {})
        with pytest.raises(EvalError, match=r"exited \(code -9\) before version 5"):
            evals.drain()
    finally:
        evals.close()

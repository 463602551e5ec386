"""The synthetic task: fixed-width problems, a fixed disjoint split, the exact-match checker."""

from __future__ import annotations

import pytest

from common.task.synthetic import ArithmeticTask, Example, is_correct, make_examples


@pytest.fixture(scope="module")
def task() -> ArithmeticTask:
    return ArithmeticTask(seed=0)


def test_problems_are_fixed_width_with_the_sum_as_answer() -> None:
    task = ArithmeticTask()
    assert task.format(7, 45) == Example("07+45=", "052")
    assert task.format(49, 97) == Example("49+97=", "146")
    assert task.format(0, 0) == Example("00+00=", "000")
    assert ArithmeticTask(digits=3).format(5, 999) == Example("005+999=", "1004")


def test_every_example_is_a_correct_sum(task: ArithmeticTask) -> None:
    for split in ("train", "heldout"):
        for i in range(300):
            ex = task.example(i, split)
            a, b = ex.prompt.removesuffix("=").split("+")
            assert len(a) == len(b) == 2
            assert len(ex.answer) == 3
            assert int(a) + int(b) == int(ex.answer)


def test_examples_are_deterministic_from_seed_split_and_index() -> None:
    one, two = ArithmeticTask(seed=5), ArithmeticTask(seed=5)
    for split in ("train", "heldout"):
        assert [one.example(i, split) for i in range(200)] == [
            two.example(i, split) for i in range(200)
        ]
    assert one.example(10**6, "train") == two.example(10**6, "train")


def test_splits_are_disjoint_and_cover_every_pair(task: ArithmeticTask) -> None:
    train, heldout = set(task.pairs("train")), set(task.pairs("heldout"))
    assert not train & heldout
    assert len(train | heldout) == 100 * 100
    assert task.heldout_size == len(heldout)
    assert task.train_size == len(train)
    assert 800 <= task.heldout_size <= 1200  # about 1 in 10


def test_no_heldout_problem_appears_in_the_train_stream(task: ArithmeticTask) -> None:
    heldout = {ex.prompt for ex in make_examples("heldout")}
    assert len(heldout) == task.heldout_size
    stream = {task.example(i, "train").prompt for i in range(20_000)}
    assert not stream & heldout
    assert len(stream) > 0.8 * task.train_size  # the stream reaches most training pairs


def test_the_split_does_not_depend_on_the_run_seed() -> None:
    assert ArithmeticTask(seed=0).pairs("heldout") == ArithmeticTask(seed=7).pairs("heldout")
    assert make_examples("heldout", 50, seed=0) == make_examples("heldout", 50, seed=7)
    assert ArithmeticTask(split_seed=1).pairs("heldout") != ArithmeticTask().pairs("heldout")


def test_the_train_stream_depends_on_the_seed() -> None:
    zero, one = ArithmeticTask(seed=0), ArithmeticTask(seed=1)
    a = [zero.example(i, "train") for i in range(50)]
    b = [one.example(i, "train") for i in range(50)]
    assert a != b


def test_a_heldout_prefix_is_a_uniform_sample(task: ArithmeticTask) -> None:
    first = [int(ex.prompt[:2]) for ex in make_examples("heldout", 300)]
    assert min(first) < 10
    assert max(first) >= 90


def test_make_examples_bounds() -> None:
    task = ArithmeticTask()
    assert len(make_examples("heldout")) == task.heldout_size
    assert len(make_examples("heldout", 10**9)) == task.heldout_size
    assert make_examples("heldout", 5, start=3) == [task.example(i, "heldout") for i in range(3, 8)]
    assert len(make_examples("train", 7)) == 7
    with pytest.raises(ValueError, match="stream"):
        make_examples("train")


def test_bad_arguments_are_refused(task: ArithmeticTask) -> None:
    with pytest.raises(ValueError, match="split"):
        task.example(0, "test")  # type: ignore[arg-type]
    with pytest.raises(IndexError):
        task.example(-1, "train")
    with pytest.raises(IndexError):
        task.example(task.heldout_size, "heldout")
    with pytest.raises(ValueError, match="digits"):
        ArithmeticTask(digits=0)
    with pytest.raises(ValueError, match="heldout_every"):
        ArithmeticTask(heldout_every=1)


@pytest.mark.parametrize(
    ("completion", "answer", "expected"),
    [
        ("052", "052", True),
        (" 052\n", "052", True),
        ("\t052  ", "052", True),
        ("52", "052", False),
        ("0520", "052", False),
        ("05 2", "052", False),
        ("052.", "052", False),
        ("", "052", False),
        ("   ", "052", False),
        ("146", "146", True),
        ("641", "146", False),
        ("146<eos>", "146", False),
        ("146", " 146\n", True),
    ],
)
def test_is_correct_is_exact_match_after_stripping(
    completion: str, answer: str, expected: bool
) -> None:
    assert is_correct(completion, answer) is expected

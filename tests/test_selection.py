"""Greedy forward selection with replacement: never worse on val, repeats allowed, weights that sum to 1."""
import numpy as np
import pytest

from galapagos.ensemble.metrics import classification_metrics, regression_metrics
from galapagos.ensemble.selection import combine, score, select


def _probs(rng, n, k, sharp=2.0):
    logits = rng.normal(0, sharp, (n, k))
    p = np.exp(logits - logits.max(1, keepdims=True))
    return p / p.sum(1, keepdims=True)


def _noisy_members(rng, y, k, members, noise):
    """Classification members: each right on the true class with its own noise."""
    out = []
    for m in range(members):
        logits = rng.normal(0, noise[m], (len(y), k))
        logits[np.arange(len(y)), y] += 2.0
        p = np.exp(logits - logits.max(1, keepdims=True))
        out.append(p / p.sum(1, keepdims=True))
    return np.stack(out)


def _check_never_worse(sel, preds, y, task):
    assert all(b < a for a, b in zip(sel.trace, sel.trace[1:]))  # every accepted step lowers the score
    assert sel.trace[0] == pytest.approx(min(sel.member_scores))  # it starts from the best single member
    assert sel.score <= min(sel.member_scores)
    assert sel.score == pytest.approx(score(combine(preds, sel.weights), y, task), rel=1e-9)
    assert sel.weights.sum() == pytest.approx(1.0) and (sel.weights >= 0).all()
    assert len(sel.picks) == sel.counts.sum() and np.array_equal(np.bincount(sel.picks, minlength=len(preds)),
                                                                 sel.counts)
    # no single further member would have lowered the score: the selection stopped at a local optimum
    if len(sel.picks) < 50:
        for k in range(len(preds)):
            w = sel.counts.astype(float)
            w[k] += 1
            assert score(combine(preds, w), y, task) >= sel.score - 1e-12


@pytest.mark.parametrize("seed", range(6))
def test_classification_never_worse_than_best_member(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 5, 200)
    preds = _noisy_members(rng, y, 5, 7, rng.uniform(0.5, 3.0, 7))
    sel = select(preds, y, "classification")
    _check_never_worse(sel, preds, y, "classification")
    assert sel.metric == "nll"
    nll = classification_metrics(combine(preds, sel.weights), y)["nll"]
    assert nll == pytest.approx(sel.score)  # the score is the NLL that ensemble.metrics reports


@pytest.mark.parametrize("seed", range(6))
def test_regression_never_worse_than_best_member(seed):
    rng = np.random.default_rng(seed)
    y = rng.normal(0, [1.0, 50.0], (150, 2))  # targets on very different scales
    preds = np.stack([y + rng.normal(0, s, y.shape) * [1.0, 50.0] + rng.normal(0, 0.3, 2)
                      for s in rng.uniform(0.2, 1.5, 6)])
    sel = select(preds, y, "regression")
    _check_never_worse(sel, preds, y, "regression")
    r2 = regression_metrics(combine(preds, sel.weights), y)["r2"]
    assert sel.score == pytest.approx(1 - r2)  # variance-normalised MSE = 1 - mean R^2


def test_picks_with_replacement():
    y = np.zeros((4, 1))
    a = np.full((4, 1), 1.0)
    b = np.full((4, 1), -2.0)
    sel = select([a, b], y, "regression")
    # A alone: 1; A+B: 0.25; A+A+B: exactly 0, so A is picked twice
    assert sel.picks == (0, 1, 0)
    assert list(sel.counts) == [2, 1] and sel.weights == pytest.approx([2 / 3, 1 / 3])
    assert sel.score == pytest.approx(0.0)


def test_a_member_that_hurts_is_never_picked():
    rng = np.random.default_rng(3)
    y = rng.integers(0, 4, 300)
    good = _noisy_members(rng, y, 4, 3, [0.8, 1.0, 1.2])
    wrong = np.full((len(y), 4), 0.01)
    wrong[np.arange(len(y)), (y + 1) % 4] = 0.97  # confidently wrong everywhere
    preds = np.concatenate([good, wrong[None]])
    sel = select(preds, y, "classification")
    assert sel.counts[3] == 0 and sel.weights[3] == 0
    _check_never_worse(sel, preds, y, "classification")


def test_one_member_gets_all_the_weight():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 50)
    p = _probs(rng, 50, 3)
    sel = select([p], y, "classification")
    assert list(sel.weights) == [1.0] and sel.picks == (0,) and sel.trace == (sel.member_scores[0],)


def test_sorted_initialisation_stops_before_a_member_that_hurts():
    y = np.zeros((3, 1))
    preds = np.stack([np.full((3, 1), v) for v in (1.0, -1.0, 1.1, 5.0)])
    sel = select(preds, y, "regression", init=4)
    assert sel.picks[:2] == (0, 1) and sel.counts[3] == 0
    _check_never_worse(sel, preds, y, "regression")


def test_max_rounds_caps_the_picks():
    rng = np.random.default_rng(1)
    y = rng.normal(size=(100, 1))
    preds = np.stack([y + rng.normal(0, 1, y.shape) for _ in range(8)])
    sel = select(preds, y, "regression", max_rounds=3)
    assert len(sel.picks) == 3 and sel.counts.sum() == 3
    assert all(b < a for a, b in zip(sel.trace, sel.trace[1:]))


def test_bagged_selection_averages_greedy_selections_over_bags_of_half_the_members():
    """Each bag is half the members, selected greedily; the weights are the bags' mean, so members of other bags
    than the greedy run's first find weight too, and the same seed gives the same ensemble."""
    rng = np.random.default_rng(4)
    y = rng.integers(0, 3, 300)
    preds = _noisy_members(rng, y, 3, 8, noise=[1.0, 1.2, 1.4, 1.6, 1.8, 2.0, 2.2, 2.4])
    sel = select(preds, y, "classification", bags=10, seed=3)
    assert sel.bags == 10 and sel.weights.sum() == pytest.approx(1.0) and (sel.weights >= 0).all()
    assert (sel.weights > 0).sum() > (select(preds, y, "classification").weights > 0).sum()
    assert sel.score == pytest.approx(score(combine(preds, sel.weights), y, "classification"), rel=1e-9)
    assert np.array_equal(np.bincount(sel.picks, minlength=len(preds)), sel.counts)
    assert np.array_equal(sel.weights, select(preds, y, "classification", bags=10, seed=3).weights)
    assert not np.array_equal(sel.weights, select(preds, y, "classification", bags=10, seed=4).weights)
    assert "bagged" in sel.to_dict()["method"] and sel.to_dict()["bags"] == 10
    one = select(preds[:1], y, "classification", bags=3)  # one member: every bag is that member
    assert one.weights.tolist() == [1.0]


def test_bad_inputs():
    y = np.zeros(4, dtype=np.int64)
    with pytest.raises(ValueError, match="targets"):
        select([np.full((5, 2), 0.5)], y, "classification")
    with pytest.raises(ValueError, match="K >= 1"):
        select(np.zeros((0, 4, 2)), y, "classification")
    with pytest.raises(ValueError, match="task"):
        select([np.full((4, 2), 0.5)], y, "ranking")
    with pytest.raises(ValueError, match="max_rounds"):
        select([np.full((4, 2), 0.5)], y, "classification", max_rounds=0)
    with pytest.raises(ValueError, match="bags"):
        select([np.full((4, 2), 0.5)], y, "classification", bags=-1)

"""Tests for turnrl.losses: hand-computed values, limits, padding invariance, gradients, TRL parity.

Expected numbers are derived in comments and evaluated with the ``math`` module, never by
calling the function under test.
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from turnrl.losses import (
    dmpo_loss,
    dmpo_weights,
    dpo_loss,
    ipo_loss,
    sft_loss,
    sppo_loss,
    turn_logps,
    turn_mask_from_counts,
)

METRIC_NAMES = {
    "chosen_logratio",
    "rejected_logratio",
    "chosen_rewards",
    "rejected_rewards",
    "reward_margin",
    "accuracy",
}


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def softplus(x: float) -> float:
    """-log sigma(-x) ... i.e. log(1 + e^x); -log sigma(x) = softplus(-x)."""
    return math.log1p(math.exp(x))


# ------------------------------------------------------------------------------------------
# SFT


def test_sft_loss_sums_masked_nll_and_ignores_masked_values() -> None:
    # action tokens: -1, -2 (row 0) and -3, -4 (row 1) -> loss_sum = 1 + 2 + 3 + 4 = 10, n = 4.
    # the masked-out -inf and -0.5 must not leak in.
    logps = torch.tensor([[-1.0, -2.0, -math.inf], [-0.5, -3.0, -4.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    loss_sum, n = sft_loss(logps, mask)
    assert loss_sum.item() == pytest.approx(10.0)
    assert n.item() == 4 and n.dtype == torch.int64
    loss_sum.backward()
    assert logps.grad is not None
    assert torch.equal(logps.grad, torch.tensor([[-1.0, -1.0, 0.0], [0.0, -1.0, -1.0]]))


def test_sft_loss_shape_mismatch() -> None:
    with pytest.raises(ValueError, match="mask has shape"):
        sft_loss(torch.zeros(2, 3), torch.ones(2, 4))


# ------------------------------------------------------------------------------------------
# per-turn log-probs


def test_turn_logps_packed_two_sequences() -> None:
    # One packed row of 10 tokens: sequence 0 = tokens 0..4, sequence 1 = tokens 5..9.
    #   seq 0: turn 0 = tokens 1, 2 (-0.1 - 0.2 = -0.3); turn 1 = token 4 (-0.3); turn 2 none (0)
    #   seq 1: turn 0 = token 6 (-0.4);                  turn 1 = tokens 8, 9 (-0.5 - 0.6 = -1.1)
    # non-agent tokens (turn -1) hold -inf / junk and must be ignored.
    logps = torch.tensor(
        [-math.inf, -0.1, -0.2, -9.0, -0.3, -math.inf, -0.4, 7.0, -0.5, -0.6], requires_grad=True
    )
    turn = torch.tensor([-1, 0, 0, -1, 1, -1, 0, -1, 1, 1])
    seq = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 1, 1])
    out = turn_logps(logps, turn, seq, num_seqs=2, max_turns=3)
    expected = torch.tensor([[-0.3, -0.3, 0.0], [-0.4, -1.1, 0.0]])
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    assert logps.grad is not None
    assert torch.equal(logps.grad, (turn >= 0).float())


def test_turn_logps_accepts_padded_2d_and_promotes_bf16() -> None:
    # [2, 3] padded batch; padding tokens have seq_index -1 and turn -1.
    logps = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, 0.0, 0.0]], dtype=torch.bfloat16)
    turn = torch.tensor([[0, 0, 1], [0, -1, -1]])
    seq = torch.tensor([[0, 0, 0], [1, -1, -1]])
    out = turn_logps(logps, turn, seq, num_seqs=2, max_turns=2)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[-3.0, -3.0], [-4.0, 0.0]]))


def test_turn_logps_errors() -> None:
    logps = torch.zeros(3)
    with pytest.raises(ValueError, match="turn_index has shape"):
        turn_logps(logps, torch.zeros(4, dtype=torch.long), torch.zeros(3, dtype=torch.long), 1, 1)
    with pytest.raises(ValueError, match=r"turn_index must lie in \[-1, 2\)"):
        turn_logps(logps, torch.tensor([0, 1, 2]), torch.zeros(3, dtype=torch.long), 1, 2)
    with pytest.raises(ValueError, match="seq_index"):
        turn_logps(logps, torch.tensor([0, 1, 1]), torch.tensor([0, 0, 1]), 1, 2)
    with pytest.raises(ValueError, match="integer"):
        turn_logps(logps, torch.zeros(3), torch.zeros(3, dtype=torch.long), 1, 1)


def test_turn_mask_from_counts() -> None:
    mask = turn_mask_from_counts(torch.tensor([0, 2, 3]), 3)
    assert mask.dtype == torch.bool
    assert mask.tolist() == [[False, False, False], [True, True, False], [True, True, True]]


# ------------------------------------------------------------------------------------------
# DPO / IPO


def test_dpo_hand_value() -> None:
    # beta = 0.1; chosen log-ratio = -5 - (-6) = 1; rejected = -9 - (-7) = -2
    # h = 1 - (-2) = 3;  L = -log sigma(0.3) = log(1 + e^-0.3) = 0.5543552444685...
    losses, m = dpo_loss(t(-5.0), t(-9.0), t(-6.0), t(-7.0), beta=0.1)
    expected = softplus(-0.3)
    assert expected == pytest.approx(0.5543552444685271)
    assert losses.shape == (1,)
    assert losses.item() == pytest.approx(expected, abs=1e-6)
    assert set(m) == METRIC_NAMES
    assert m["chosen_logratio"].item() == pytest.approx(1.0)
    assert m["rejected_logratio"].item() == pytest.approx(-2.0)
    assert m["chosen_rewards"].item() == pytest.approx(0.1)
    assert m["rejected_rewards"].item() == pytest.approx(-0.2)
    assert m["reward_margin"].item() == pytest.approx(0.3)
    assert m["accuracy"].item() == 1.0


def test_chosen_nll_hand_value_and_checks() -> None:
    from turnrl.losses import chosen_nll

    # log-probs -6 over 3 tokens -> 2; -1 over 4 tokens -> 0.25
    got = chosen_nll(torch.tensor([-6.0, -1.0]), torch.tensor([3, 4]))
    assert got.tolist() == pytest.approx([2.0, 0.25])
    with pytest.raises(ValueError, match="chosen_tokens"):
        chosen_nll(torch.tensor([-1.0]), torch.tensor([0]))


def test_dpo_label_smoothing_hand_value() -> None:
    # eps = 0.2, x = beta h = 0.3:
    # L = 0.8 log(1+e^-x) + 0.2 log(1+e^x);  log(1+e^x) = x + log(1+e^-x)
    #   = log(1+e^-0.3) + 0.2 * 0.3 = 0.5543552 + 0.06 = 0.6143552
    losses, _ = dpo_loss(t(-5.0), t(-9.0), t(-6.0), t(-7.0), beta=0.1, label_smoothing=0.2)
    expected = 0.8 * softplus(-0.3) + 0.2 * softplus(0.3)
    assert expected == pytest.approx(0.6143552444685272)
    assert losses.item() == pytest.approx(expected, abs=1e-6)


def test_dpo_metrics_are_detached_per_sample_and_accuracy_counts_ties_as_wrong() -> None:
    pc = torch.tensor([0.0, 1.0, -1.0], requires_grad=True)
    losses, m = dpo_loss(pc, torch.zeros(3), torch.zeros(3), torch.zeros(3), beta=0.5)
    assert losses.shape == (3,)
    for value in m.values():
        assert value.shape == (3,) and not value.requires_grad
    # margins 0, 0.5, -0.5 -> accuracy 0, 1, 0
    assert m["accuracy"].tolist() == [0.0, 1.0, 0.0]
    assert m["reward_margin"].tolist() == pytest.approx([0.0, 0.5, -0.5])


def test_dpo_validation() -> None:
    with pytest.raises(ValueError, match="ref_rejected_logps has shape"):
        dpo_loss(torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(2), beta=0.0)
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo_loss(torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(2), label_smoothing=0.5)


def test_ipo_hand_values() -> None:
    # h = 3 (as above).  beta = 0.5: 1/(2 beta) = 1 -> (3 - 1)^2 = 4
    #                    beta = 0.1: 1/(2 beta) = 5 -> (3 - 5)^2 = 4
    #                    beta = 0.25: 1/(2 beta) = 2 -> (3 - 2)^2 = 1
    for beta, expected in ((0.5, 4.0), (0.1, 4.0), (0.25, 1.0)):
        losses, m = ipo_loss(t(-5.0), t(-9.0), t(-6.0), t(-7.0), beta=beta)
        assert losses.item() == pytest.approx(expected, abs=1e-5)
        assert m["reward_margin"].item() == pytest.approx(3 * beta)
        assert set(m) == METRIC_NAMES


def test_dpo_ipo_gradients_flow() -> None:
    g = torch.Generator().manual_seed(0)
    pc = torch.randn(4, generator=g, requires_grad=True)
    pr = torch.randn(4, generator=g, requires_grad=True)
    rc, rr = torch.randn(4, generator=g), torch.randn(4, generator=g)
    for fn in (dpo_loss, ipo_loss):
        pc.grad = pr.grad = None
        losses, _ = fn(pc, pr, rc, rr, beta=0.1)
        losses.mean().backward()
        assert pc.grad is not None and pr.grad is not None
        assert torch.isfinite(pc.grad).all() and torch.isfinite(pr.grad).all()
        # raising the chosen log-prob lowers the loss
        assert (pc.grad < 0).all()


# ------------------------------------------------------------------------------------------
# DMPO weights


def test_dmpo_weights_small_t_exact() -> None:
    # gamma = 0.5
    # T = 3: t=0: 1 * (1 - 0.125) / 0.875 = 1
    #        t=1: 0.5 * (1 - 0.25) / 0.875 = 0.375 / 0.875 = 3/7
    #        t=2: 0.25 * (1 - 0.5) / 0.875 = 0.125 / 0.875 = 1/7
    #        t=3: padding -> 0
    # T = 2: t=0: (1 - 0.25)/(1 - 0.25) = 1;  t=1: 0.5 * 0.5 / 0.75 = 1/3
    # T = 1: [1, 0, 0, 0];  T = 0: all zeros (no NaN from 0/0)
    w = dmpo_weights(torch.tensor([3, 2, 1, 0]), 4, 0.5)
    expected = torch.tensor(
        [
            [1.0, 3 / 7, 1 / 7, 0.0],
            [1.0, 1 / 3, 0.0, 0.0],
            [1.0, 0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0, 0.0],
        ]
    )
    torch.testing.assert_close(w, expected)


def test_dmpo_weights_gamma_zero_is_first_action_only() -> None:
    w = dmpo_weights(torch.tensor([4, 1, 0]), 5, 0.0)
    assert w.tolist() == [[1.0, 0, 0, 0, 0], [1.0, 0, 0, 0, 0], [0.0, 0, 0, 0, 0]]


@pytest.mark.parametrize("gamma", [1.0, 1.0 - 1e-9, 1.0 - 5e-7])
def test_dmpo_weights_gamma_one_limit(gamma: float) -> None:
    # phi(t, T) -> (T - t) / T, e.g. T = 4: [1, 3/4, 1/2, 1/4]
    w = dmpo_weights(torch.tensor([4, 2]), 5, gamma)
    expected = torch.tensor([[1.0, 0.75, 0.5, 0.25, 0.0], [1.0, 0.5, 0.0, 0.0, 0.0]])
    torch.testing.assert_close(w, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("gamma", [0.1, 0.7, 0.99, 0.9999, 1.0 - 2e-6])
def test_dmpo_weights_match_float64_formula(gamma: float) -> None:
    # Reference: the textbook formula in double precision with Python floats.
    lengths = [1, 2, 5, 17, 40]
    w = dmpo_weights(torch.tensor(lengths), 40, gamma)
    assert w.dtype == torch.float32
    for row, big_t in enumerate(lengths):
        for step in range(40):
            ref = gamma**step * (1 - gamma ** (big_t - step)) / (1 - gamma**big_t) if step < big_t else 0.0
            assert w[row, step].item() == pytest.approx(ref, rel=1e-5, abs=1e-7)


def test_dmpo_weights_continuous_across_gamma_one_branch() -> None:
    # Just outside the exact-limit branch the formula must agree with the limit to O((1-gamma) T).
    n = torch.tensor([10])
    inside = dmpo_weights(n, 10, 1.0 - 0.9e-6)
    outside = dmpo_weights(n, 10, 1.0 - 1.1e-6)
    torch.testing.assert_close(inside, outside, atol=1e-4, rtol=0)


def test_dmpo_weights_validation() -> None:
    with pytest.raises(ValueError, match="gamma"):
        dmpo_weights(torch.tensor([2]), 2, 1.5)
    with pytest.raises(ValueError, match="num_turns must be 1-D"):
        dmpo_weights(torch.tensor([[2]]), 2, 0.5)


# ------------------------------------------------------------------------------------------
# DMPO loss


def _dmpo_example() -> dict[str, Any]:
    # chosen: T_w = 3, width 3, Delta_w = policy - ref = [1, 2, -1]
    # rejected: T_l = 2, width 4 (2 padding turns), Delta_l = [-1, 3]
    return {
        "policy_chosen_turn_logps": torch.tensor([[-1.0, -1.0, -3.0]]),
        "ref_chosen_turn_logps": torch.tensor([[-2.0, -3.0, -2.0]]),
        "policy_rejected_turn_logps": torch.tensor([[-2.0, 0.0, 0.0, 0.0]]),
        "ref_rejected_turn_logps": torch.tensor([[-1.0, -3.0, 0.0, 0.0]]),
        "chosen_num_turns": torch.tensor([3]),
        "rejected_num_turns": torch.tensor([2]),
    }


def test_dmpo_hand_value() -> None:
    # gamma = 0.5, beta = 0.1
    # chosen:   phi(., 3) = [1, 3/7, 1/7] -> 1*1 + (3/7)*2 + (1/7)*(-1) = 1 + 6/7 - 1/7 = 12/7
    # rejected: phi(., 2) = [1, 1/3]      -> 1*(-1) + (1/3)*3 = 0
    # L = -log sigma(0.1 * (12/7 - 0)) = log(1 + e^{-0.1714285...}) = 0.6111018749...
    losses, m = dmpo_loss(**_dmpo_example(), beta=0.1, gamma=0.5)
    expected = softplus(-0.1 * 12 / 7)
    assert expected == pytest.approx(0.61110187490068)
    assert losses.item() == pytest.approx(expected, abs=1e-6)
    assert set(m) == METRIC_NAMES
    assert m["chosen_logratio"].item() == pytest.approx(12 / 7, abs=1e-6)
    assert m["rejected_logratio"].item() == pytest.approx(0.0, abs=1e-6)
    assert m["reward_margin"].item() == pytest.approx(0.1 * 12 / 7, abs=1e-6)
    assert m["accuracy"].item() == 1.0


def test_dmpo_padding_turns_contribute_nothing() -> None:
    base, _ = dmpo_loss(**_dmpo_example(), beta=0.1, gamma=0.5)
    ex = _dmpo_example()
    # overwrite the rejected padding turns (t = 2, 3) with junk, inf and nan included
    ex["policy_rejected_turn_logps"][0, 2:] = torch.tensor([123.0, math.nan])
    ex["ref_rejected_turn_logps"][0, 2:] = torch.tensor([-math.inf, 5.0])
    ex["policy_rejected_turn_logps"].requires_grad_(True)
    changed, _ = dmpo_loss(**ex, beta=0.1, gamma=0.5)
    assert changed.item() == base.item()
    changed.sum().backward()
    grad = ex["policy_rejected_turn_logps"].grad
    assert grad is not None and torch.isfinite(grad).all()
    assert grad[0, 2:].tolist() == [0.0, 0.0]


def test_dmpo_different_lengths_batch_matches_per_pair() -> None:
    # A batch with different T_w, T_l per row gives the same loss per row as each row alone
    # with its own (unpadded) width.
    g = torch.Generator().manual_seed(1)
    tc, tr = torch.tensor([3, 1, 5]), torch.tensor([2, 4, 1])
    pc, rc = torch.randn(3, 5, generator=g), torch.randn(3, 5, generator=g)
    pr, rr = torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g)
    batch, _ = dmpo_loss(pc, pr, rc, rr, tc, tr, beta=0.3, gamma=0.8)
    for i in range(3):
        ci, ri = int(tc[i]), int(tr[i])
        single, _ = dmpo_loss(
            pc[i : i + 1, :ci], pr[i : i + 1, :ri], rc[i : i + 1, :ci], rr[i : i + 1, :ri],
            tc[i : i + 1], tr[i : i + 1], beta=0.3, gamma=0.8,
        )  # fmt: skip
        torch.testing.assert_close(batch[i : i + 1], single)


@pytest.mark.parametrize("gamma", [0.0, 1e-8])
def test_dmpo_gamma_to_zero_is_dpo_on_first_action(gamma: float) -> None:
    g = torch.Generator().manual_seed(2)
    tc, tr = torch.tensor([3, 1, 4, 2]), torch.tensor([2, 4, 1, 3])
    pc, rc = torch.randn(4, 4, generator=g), torch.randn(4, 4, generator=g)
    pr, rr = torch.randn(4, 5, generator=g), torch.randn(4, 5, generator=g)
    got, gm = dmpo_loss(pc, pr, rc, rr, tc, tr, beta=0.5, gamma=gamma)
    want, wm = dpo_loss(pc[:, 0], pr[:, 0], rc[:, 0], rr[:, 0], beta=0.5)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    torch.testing.assert_close(gm["reward_margin"], wm["reward_margin"], atol=1e-6, rtol=0)


@pytest.mark.parametrize("gamma", [1.0, 1.0 - 1e-9])
def test_dmpo_gamma_to_one_weights_linear(gamma: float) -> None:
    # phi = (T - t) / T: chosen T=2, Delta=[2, 4] -> 2 + 4/2 = 4; rejected T=1, Delta=[1] -> 1
    # L = -log sigma(beta (4 - 1)) with beta = 0.2 -> log(1 + e^-0.6)
    losses, m = dmpo_loss(
        torch.tensor([[2.0, 4.0]]), torch.tensor([[1.0, 9.0]]),
        torch.zeros(1, 2), torch.zeros(1, 2),
        torch.tensor([2]), torch.tensor([1]), beta=0.2, gamma=gamma,
    )  # fmt: skip
    assert m["chosen_logratio"].item() == pytest.approx(4.0, abs=1e-6)
    assert m["rejected_logratio"].item() == pytest.approx(1.0, abs=1e-6)
    assert losses.item() == pytest.approx(softplus(-0.6), abs=1e-6)


def test_dmpo_gradients_flow() -> None:
    g = torch.Generator().manual_seed(3)
    pc = torch.randn(2, 3, generator=g, requires_grad=True)
    pr = torch.randn(2, 6, generator=g, requires_grad=True)
    losses, _ = dmpo_loss(
        pc, pr, torch.randn(2, 3, generator=g), torch.randn(2, 6, generator=g),
        torch.tensor([3, 2]), torch.tensor([6, 1]), beta=0.1, gamma=0.7,
    )  # fmt: skip
    losses.mean().backward()
    assert pc.grad is not None and pr.grad is not None
    assert torch.isfinite(pc.grad).all() and torch.isfinite(pr.grad).all()
    assert (pc.grad[0] < 0).all() and (pr.grad[0] > 0).all()
    assert pc.grad[1, 2].item() == 0.0  # padding turn of row 1
    assert (pr.grad[1, 1:] == 0).all()


def test_dmpo_validation() -> None:
    ex = _dmpo_example()
    with pytest.raises(ValueError, match="ref_chosen_turn_logps has shape"):
        dmpo_loss(**{**ex, "ref_chosen_turn_logps": torch.zeros(1, 4)})
    with pytest.raises(ValueError, match=r"rejected_num_turns must lie in \[0, 4\]"):
        dmpo_loss(**{**ex, "rejected_num_turns": torch.tensor([5])})
    with pytest.raises(ValueError, match="batch size"):
        dmpo_loss(**{**ex, "chosen_num_turns": torch.tensor([3, 3])})
    with pytest.raises(ValueError, match="must be 2-D"):
        dmpo_loss(**{**ex, "policy_chosen_turn_logps": torch.zeros(3)})


# ------------------------------------------------------------------------------------------
# SPPO


def test_sppo_soft_hand_values() -> None:
    # eta = 2
    # sample 0: log-ratio -1.2 - (-1.5) = 0.3, P = 0.8  -> target 2 * 0.3 = 0.6   -> (0.3 - 0.6)^2 = 0.09
    # sample 1: log-ratio -2.5 - (-2.0) = -0.5, P = 0.25 -> target 2 * -0.25 = -0.5 -> 0
    # sample 2: log-ratio 1.0, P = 0.5 (tie)             -> target 0              -> 1
    losses, m = sppo_loss(t(-1.2, -2.5, 0.0), t(-1.5, -2.0, -1.0), t(0.8, 0.25, 0.5), eta=2.0)
    torch.testing.assert_close(losses, t(0.09, 0.0, 1.0))
    torch.testing.assert_close(m["target"], t(0.6, -0.5, 0.0))
    torch.testing.assert_close(m["logratio"], t(0.3, -0.5, 1.0))
    torch.testing.assert_close(m["error"], t(-0.3, 0.0, 1.0))
    assert set(m) == {"logratio", "win_rate", "target", "error"}


def test_sppo_hard_hand_values() -> None:
    # eta = 4: winner target +eta/2 = +2, loser target -eta/2 = -2
    # winner log-ratio 1.5 -> (1.5 - 2)^2 = 0.25;  loser log-ratio -1 -> (-1 + 2)^2 = 1
    losses, m = sppo_loss(
        t(1.5, -1.0), t(0.0, 0.0), None, eta=4.0, variant="hard", is_chosen=torch.tensor([True, False])
    )
    torch.testing.assert_close(losses, t(0.25, 1.0))
    torch.testing.assert_close(m["win_rate"], t(1.0, 0.0))
    # hard == soft with P replaced by 1 / 0
    soft, _ = sppo_loss(t(1.5, -1.0), t(0.0, 0.0), t(1.0, 0.0), eta=4.0)
    torch.testing.assert_close(losses, soft)


def test_sppo_gradients_and_validation() -> None:
    p = torch.tensor([0.1, -0.2], requires_grad=True)
    losses, m = sppo_loss(p, torch.zeros(2), t(0.9, 0.1), eta=1.0)
    losses.sum().backward()
    assert p.grad is not None and torch.isfinite(p.grad).all()
    # d/dp (p - target)^2 = 2 (p - target): targets 0.4, -0.4 -> 2 * (-0.3), 2 * 0.2
    torch.testing.assert_close(p.grad, t(-0.6, 0.4))
    assert not m["logratio"].requires_grad
    with pytest.raises(ValueError, match="is_chosen"):
        sppo_loss(torch.zeros(2), torch.zeros(2), None, eta=1.0, variant="hard")
    with pytest.raises(ValueError, match="win_rates"):
        sppo_loss(torch.zeros(2), torch.zeros(2), None, eta=1.0)
    with pytest.raises(ValueError, match="win_rates has shape"):
        sppo_loss(torch.zeros(2), torch.zeros(2), torch.zeros(3), eta=1.0)
    with pytest.raises(ValueError, match="variant"):
        sppo_loss(torch.zeros(2), torch.zeros(2), torch.zeros(2), eta=1.0, variant="medium")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eta"):
        sppo_loss(torch.zeros(2), torch.zeros(2), torch.zeros(2), eta=-1.0)


# ------------------------------------------------------------------------------------------
# Parity with TRL's DPOTrainer
#
# TRL 1.16 computes its losses inline in ``DPOTrainer._compute_loss`` (no standalone
# ``dpo_loss``). We call that method unbound on a stub ``self`` that carries only the
# attributes it reads, with a fake model returning prescribed per-sequence log-probs (one
# completion token per sequence) and reference log-probs passed as precomputed. If TRL's
# internals change shape, the test skips with the reason instead of failing.


def _trl_loss(
    loss_type: str,
    pc: torch.Tensor,
    pr: torch.Tensor,
    rc: torch.Tensor,
    rr: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> float:
    dpo_trainer = pytest.importorskip("trl.trainer.dpo_trainer", reason="trl not installed")
    n = pc.shape[0]
    logps = torch.cat([pc, pr]).unsqueeze(1)  # TRL batches [chosen; rejected]; one completion token each

    class FakeModel:
        training = True

        def __call__(self, **kwargs: Any) -> SimpleNamespace:
            return SimpleNamespace(
                log_probs=logps,
                entropy=torch.zeros(2 * n, 1),
                mean_logits=torch.zeros(2 * n, 1),
                is_top1=torch.zeros(2 * n, 1, dtype=torch.bool),
            )

    model = FakeModel()
    identity = lambda x: x  # noqa: E731
    stub = SimpleNamespace(
        model=model,
        accelerator=SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=identity, gather=identity),
        precompute_ref_logps=True,
        ld_alpha=None,
        f_divergence_type="reverse_kl",
        loss_types=[loss_type],
        loss_weights=[1.0],
        beta=beta,
        label_smoothing=label_smoothing,
        use_weighting=False,
        aux_loss_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _total_train_tokens=0,
        _tp_size=1,
        args=SimpleNamespace(),
    )
    inputs = {
        "input_ids": torch.zeros(2 * n, 2, dtype=torch.long),
        "attention_mask": torch.ones(2 * n, 2, dtype=torch.long),
        # prompt token then one completion token: 1 completion token per sequence, so TRL's
        # per-token normalisation (ipo) divides by 1.
        "completion_mask": torch.tensor([[0, 1]] * (2 * n)),
        "ref_chosen_logps": rc,
        "ref_rejected_logps": rr,
    }
    try:
        loss = dpo_trainer.DPOTrainer._compute_loss(stub, model, inputs, return_outputs=False)
    except (AttributeError, KeyError, TypeError) as exc:  # TRL internals changed
        pytest.skip(f"cannot call TRL's DPOTrainer._compute_loss standalone: {exc!r}")
    return float(loss)


def _random_pairs(n: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n, generator=g, dtype=torch.float64) * 5 - 20 for _ in range(4))


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_matches_trl_sigmoid(beta: float) -> None:
    pc, pr, rc, rr = _random_pairs(16, seed=4)
    ours, _ = dpo_loss(pc, pr, rc, rr, beta=beta)
    assert ours.mean().item() == pytest.approx(_trl_loss("sigmoid", pc, pr, rc, rr, beta), abs=1e-6)


def test_ipo_matches_trl_ipo_with_one_token_completions() -> None:
    pc, pr, rc, rr = _random_pairs(16, seed=5)
    ours, _ = ipo_loss(pc, pr, rc, rr, beta=0.1)
    assert ours.mean().item() == pytest.approx(_trl_loss("ipo", pc, pr, rc, rr, 0.1), rel=1e-6)


def test_label_smoothing_matches_trl_aot_with_single_pair() -> None:
    # TRL's sigmoid loss has no label smoothing; its "aot" loss is the smoothed sigmoid on
    # sorted batches, which for one pair is exactly conservative DPO.
    for seed in range(3):
        pc, pr, rc, rr = _random_pairs(1, seed=6 + seed)
        ours, _ = dpo_loss(pc, pr, rc, rr, beta=0.2, label_smoothing=0.3)
        theirs = _trl_loss("aot", pc, pr, rc, rr, 0.2, label_smoothing=0.3)
        assert ours.item() == pytest.approx(theirs, abs=1e-6)


def test_sppo_hard_matches_trl_with_eta_inverse_beta() -> None:
    # TRL sppo_hard per pair: (l_w - 1/(2 beta))^2 + (l_l + 1/(2 beta))^2 == our hard loss on
    # the winner plus on the loser with eta = 1 / beta.
    pc, pr, rc, rr = (x / 10 for x in _random_pairs(16, seed=9))
    beta = 0.25
    win, _ = sppo_loss(pc, rc, None, eta=1 / beta, variant="hard", is_chosen=torch.ones(16, dtype=torch.bool))
    lose, _ = sppo_loss(
        pr, rr, None, eta=1 / beta, variant="hard", is_chosen=torch.zeros(16, dtype=torch.bool)
    )
    theirs = _trl_loss("sppo_hard", pc, pr, rc, rr, beta)
    assert (win + lose).mean().item() == pytest.approx(theirs, rel=1e-6)


# ============================================================================================
# ArCHer losses (appended section)

from turnrl.losses import archer_actor_loss, archer_advantage, archer_q_loss, archer_v_loss  # noqa: E402


def test_archer_q_loss_hand_computed() -> None:
    # sample 0: r=-1, not done, Vbar(s') = (2, 3), gamma 0.5 -> y = (-1 + 1, -1 + 1.5) = (0, 0.5)
    #           Q = (1, 1) -> (1-0)^2 + (1-0.5)^2 = 1.25
    # sample 1: r=1, done -> y = (1, 1) whatever Vbar; Q = (0, 3) -> 1 + 4 = 5
    q1, q2 = torch.tensor([1.0, 0.0], requires_grad=True), torch.tensor([1.0, 3.0])
    losses, m = archer_q_loss(q1, q2, torch.tensor([-1.0, 1.0]), torch.tensor([0.0, 1.0]),
                              torch.tensor([2.0, 100.0]), torch.tensor([3.0, -100.0]), gamma=0.5)
    assert losses.tolist() == pytest.approx([1.25, 5.0])
    assert m["target_q1"].tolist() == pytest.approx([0.0, 1.0]) and m["target_q2"].tolist() == pytest.approx([0.5, 1.0])
    losses.sum().backward()
    assert q1.grad is not None and q1.grad.tolist() == pytest.approx([2 * (1 - 0), 2 * (0 - 1)])


def test_archer_q_loss_targets_carry_no_gradient() -> None:
    v_next = torch.tensor([1.0], requires_grad=True)
    losses, _ = archer_q_loss(torch.tensor([0.0], requires_grad=True), torch.tensor([0.0]), torch.tensor([0.0]),
                              torch.tensor([0.0]), v_next, v_next, gamma=0.9)
    losses.sum().backward()
    assert v_next.grad is None
    with pytest.raises(ValueError, match="gamma"):
        archer_q_loss(*(torch.zeros(1),) * 6, gamma=1.5)


def test_archer_v_loss_twin_and_min_targets() -> None:
    # V = (0, 0), Qbar = (1, -2): twin -> 1 + 4 = 5; min -> both on -2 -> 4 + 4 = 8
    v1, v2, t1, t2 = torch.tensor([0.0]), torch.tensor([0.0]), torch.tensor([1.0]), torch.tensor([-2.0])
    assert archer_v_loss(v1, v2, t1, t2)[0].item() == pytest.approx(5.0)
    assert archer_v_loss(v1, v2, t1, t2, use_min=True)[0].item() == pytest.approx(8.0)
    # the targets are detached inside (their docstring): no gradient reaches the target critic
    v1, t1, t2 = (torch.tensor([x], requires_grad=True) for x in (0.0, 1.0, -2.0))
    for use_min in (False, True):
        archer_v_loss(v1, v1, t1, t2, use_min=use_min)[0].sum().backward()
        assert t1.grad is None and t2.grad is None and v1.grad is not None


def test_archer_advantage_is_min_q_minus_min_v() -> None:
    a = archer_advantage(torch.tensor([1.0, 5.0]), torch.tensor([2.0, 4.0]), torch.tensor([0.5, 3.0]),
                         torch.tensor([0.0, 6.0]))
    assert a.tolist() == pytest.approx([1.0 - 0.0, 4.0 - 3.0])


def test_archer_actor_loss_utterance_and_token_baselines() -> None:
    # two utterances, log-probs (-1, -2, pad) and (-0.5, pad, pad); q = (3, 1), V = (1, 2)
    # utterance baseline: A = (2, -1); L = (-2 * -3, 1 * -0.5) = (6, -0.5)
    lp = torch.tensor([[-1.0, -2.0, 7.0], [-0.5, 9.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    q, v = torch.tensor([3.0, 1.0]), torch.tensor([1.0, 2.0])
    losses, m = archer_actor_loss(lp, mask, q, v)
    assert losses.tolist() == pytest.approx([6.0, -0.5])
    assert m["advantage"].tolist() == pytest.approx([2.0, -1.0]) and m["logp"].tolist() == pytest.approx([-3.0, -0.5])
    losses.sum().backward()
    assert lp.grad is not None and lp.grad.flatten().tolist() == pytest.approx([-2.0, -2.0, 0.0, 1.0, 0.0, 0.0])
    # the advantage is a weight, detached: no gradient reaches the critic's Q or V through the actor's loss
    qg, vg = (x.clone().requires_grad_() for x in (q, v))
    archer_actor_loss(lp.detach().requires_grad_(), mask, qg, vg)[0].sum().backward()
    assert qg.grad is None and vg.grad is None
    # token baseline b = [[0, 3, x], [1, x, x]]: weights (3, 0) and (0): L = (-(3*-1 + 0*-2), 0) = (3, 0)
    tb = torch.tensor([[0.0, 3.0, 5.0], [1.0, 5.0, 5.0]])
    losses2, _ = archer_actor_loss(lp, mask, q, tb)
    assert losses2.tolist() == pytest.approx([3.0, 0.0])


# ------------------------------------------------------------------------------------------
# PPO (RLFT): clipped surrogate, KL estimators, full-vocabulary KL, value loss, advantages

from turnrl.losses import (  # noqa: E402
    batch_baseline_advantages,
    full_kl,
    gae,
    group_baseline_advantages,
    kl_penalty,
    ppo_loss,
    ppo_policy_loss,
    rewards_to_go,
    value_loss,
)


def test_ppo_policy_loss_hand_values_and_clipping() -> None:
    # eps 0.2; tokens: (rho, A) = (1, 0.5), (1.5, 1), (1.5, -1), (0.5, 1), (0.5, -1)
    #  1: rho = 1 -> L = -0.5, not clipped
    #  2: min(1.5, 1.2) = 1.2 -> L = -1.2, clipped (no gradient)
    #  3: min(-1.5, -1.2) = -1.5 -> L = 1.5, unclipped (pessimistic branch keeps the gradient)
    #  4: min(0.5, 0.8) = 0.5 -> L = -0.5, unclipped
    #  5: min(-0.5, -0.8) = -0.8 -> L = 0.8, clipped
    rho = [1.0, 1.5, 1.5, 0.5, 0.5]
    adv = t(0.5, 1.0, -1.0, 1.0, -1.0)
    old = t(-1.0, -2.0, -0.7, -1.2, -3.0)
    logps = (old + torch.tensor([math.log(r) for r in rho])).clone().requires_grad_(True)
    losses, m = ppo_policy_loss(logps, old, adv, clip_eps=0.2)
    assert losses.tolist() == pytest.approx([-0.5, -1.2, 1.5, -0.5, 0.8], abs=1e-6)
    assert m["clipped"].tolist() == [0.0, 1.0, 0.0, 0.0, 1.0]
    assert m["ratio"].tolist() == pytest.approx(rho, abs=1e-6)
    # approx_kl = (rho - 1) - log rho: 0, 0.5 - log 1.5, ..., -0.5 - log 0.5
    assert m["approx_kl"].tolist() == pytest.approx(
        [0.0, 0.5 - math.log(1.5), 0.5 - math.log(1.5), -0.5 - math.log(0.5), -0.5 - math.log(0.5)], abs=1e-6)
    losses.sum().backward()
    assert logps.grad is not None
    # dL/dlogp = -A * rho on unclipped tokens, 0 on clipped ones
    assert logps.grad.tolist() == pytest.approx([-0.5, 0.0, 1.5, -0.5, 0.0], abs=1e-6)
    assert all(not v.requires_grad for v in m.values())


def test_ppo_loss_at_start_ratio_one_kl_zero() -> None:
    # first minibatch: policy == old == reference -> ratio 1, KL 0, L = -A
    logps = t(-0.3, -2.0, -1.1).requires_grad_(True)
    adv = t(0.5, -1.0, 2.0)
    for est in ("k1", "k3"):
        losses, m = ppo_loss(logps, logps.detach(), adv, beta_kl=0.05, ref_logps=logps.detach(), kl_estimator=est)
        assert losses.tolist() == pytest.approx([-0.5, 1.0, -2.0], abs=1e-7)
        assert m["kl"].abs().max().item() == 0.0 and m["ratio"].tolist() == [1.0, 1.0, 1.0]
        assert m["clipped"].sum().item() == 0.0 and m["approx_kl"].abs().max().item() == 0.0
    lp = torch.log_softmax(torch.randn(3, 7), dim=-1)
    losses, m = ppo_loss(logps, logps.detach(), adv, beta_kl=0.05, logprobs=lp, ref_logprobs=lp.clone())
    assert m["kl"].abs().max().item() < 1e-6


def test_kl_estimators_hand_values() -> None:
    # log pi = -1, log ref = -2 -> delta = ref - pi = -1; k1 = 1, k3 = e^-1 - 1 + 1 = e^-1
    logps, ref = t(-1.0), t(-2.0)
    assert kl_penalty(logps, ref, "k1").item() == pytest.approx(1.0)
    assert kl_penalty(logps, ref, "k3").item() == pytest.approx(math.exp(-1.0))
    # k3 is >= 0 where k1 is negative: log pi = -2, log ref = -1 -> k1 = -1, k3 = e - 2
    assert kl_penalty(t(-2.0), t(-1.0), "k1").item() == pytest.approx(-1.0)
    assert kl_penalty(t(-2.0), t(-1.0), "k3").item() == pytest.approx(math.e - 2.0)
    with pytest.raises(ValueError, match="k1"):
        kl_penalty(logps, ref, "k2")  # type: ignore[arg-type]


def test_kl_gradients_by_hand_and_in_expectation() -> None:
    """At log pi = -1, log ref = -2 (delta = -1): d k3 / d log pi is 1 - e^-1 pathwise and 1 with the
    score-function term (value unchanged). Summed over a categorical's tokens, weighted by pi (the
    expectation over the sampled token), pathwise k3 gives the gradient of KL(ref || pi), pathwise k1 gives
    0, and ``full`` gives the gradient of KL(pi || ref) for both (what full_kl's autograd gives)."""
    for est, grad, want in (("k3", "pathwise", 1 - math.exp(-1.0)), ("k3", "full", 1.0),
                            ("k1", "pathwise", 1.0), ("k1", "full", 2.0)):
        lp = t(-1.0).requires_grad_(True)
        value = kl_penalty(lp, t(-2.0), est, grad)  # type: ignore[arg-type]
        value.backward()
        assert value.item() == pytest.approx(math.exp(-1.0) if est == "k3" else 1.0)
        assert lp.grad is not None and lp.grad.item() == pytest.approx(want, abs=1e-6)

    g = torch.Generator().manual_seed(0)
    theta, ref = torch.randn(6, generator=g, dtype=torch.float64), torch.log_softmax(torch.randn(6, generator=g), -1)

    def expected_grad(est: str, grad: str) -> torch.Tensor:
        th = theta.clone().requires_grad_(True)
        logp = torch.log_softmax(th, -1)
        terms = kl_penalty(logp, ref.to(logp.dtype), est, grad)  # type: ignore[arg-type]
        (logp.exp().detach() * terms).sum().backward()  # E over x ~ pi of each token's gradient
        assert th.grad is not None
        return th.grad

    def kl_grad(forward: bool) -> torch.Tensor:
        th = theta.clone().requires_grad_(True)
        logp = torch.log_softmax(th, -1)
        r = ref.to(logp.dtype)
        # KL(pi || ref) is full_kl's; KL(ref || pi) = sum ref (log ref - log pi), written out (full_kl
        # takes no gradient through its second argument)
        kl = full_kl(logp[None], r[None]).sum() if forward else (r.exp() * (r - logp)).sum()
        kl.backward()
        assert th.grad is not None
        return th.grad

    assert torch.allclose(expected_grad("k3", "pathwise"), kl_grad(forward=False), atol=1e-10)
    assert torch.allclose(expected_grad("k1", "pathwise"), torch.zeros(6, dtype=torch.float64), atol=1e-10)
    for est in ("k1", "k3"):
        assert torch.allclose(expected_grad(est, "full"), kl_grad(forward=True), atol=1e-10)
    assert not torch.allclose(kl_grad(True), kl_grad(False), atol=1e-3)  # the two directions differ here
    with pytest.raises(ValueError, match="pathwise"):
        kl_penalty(t(-1.0), t(-2.0), "k3", "exact")  # type: ignore[arg-type]


def test_full_kl_hand_value_and_beta_weighting() -> None:
    # pi = (1/2, 1/2), ref = (1/4, 3/4): KL = 1/2 log 2 + 1/2 log(2/3)
    lp = torch.log(torch.tensor([[0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.75]]))
    want = 0.5 * math.log(2) + 0.5 * math.log(2 / 3)
    assert full_kl(lp, ref).item() == pytest.approx(want, abs=1e-6)
    # in ppo_loss with rho = 1, A = 0: L = beta * KL
    losses, m = ppo_loss(t(-0.7), t(-0.7), t(0.0), beta_kl=0.1, logprobs=lp, ref_logprobs=ref)
    assert losses.item() == pytest.approx(0.1 * want, abs=1e-6)
    assert m["kl"].item() == pytest.approx(want, abs=1e-6)
    with pytest.raises(ValueError, match="ref_logps"):
        ppo_loss(t(-0.7), t(-0.7), t(1.0), beta_kl=0.1)


def test_value_loss_plain_and_clipped() -> None:
    # V=2, V_old=1, R=3, c=0.5: unclipped (2-3)^2 = 1, clipped (1.5-3)^2 = 2.25 -> 0.5 * 2.25
    v = t(2.0, 0.0).requires_grad_(True)
    losses, m = value_loss(v, t(3.0, 1.0), old_values=t(1.0, 0.0), clip=0.5)
    assert losses.tolist() == pytest.approx([1.125, 0.5])
    assert m["value_clipped"].tolist() == [1.0, 0.0]
    plain, _ = value_loss(v, t(3.0, 1.0))
    assert plain.tolist() == pytest.approx([0.5, 0.5])


def test_rewards_to_go_and_batch_baseline() -> None:
    # rewards [1, 2, 3], gamma 0.5: G = [1 + 0.5*2 + 0.25*3, 2 + 0.5*3, 3] = [2.75, 3.5, 3]
    r = torch.tensor([[1.0, 2.0, 3.0], [5.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    g = rewards_to_go(r, mask, 0.5)
    assert g.flatten().tolist() == pytest.approx([2.75, 3.5, 3.0, 5.0, 0.0, 0.0])
    assert rewards_to_go(r[:1], mask[:1], 1.0).tolist() == [[6.0, 5.0, 3.0]]
    # G = [[3, 1], [1, 3]] -> baseline [2, 2] -> A = [[1, -1], [-1, 1]]
    a = batch_baseline_advantages(torch.tensor([[3.0, 1.0], [1.0, 3.0]]), torch.ones(2, 2))
    assert a.tolist() == [[1.0, -1.0], [-1.0, 1.0]]
    # a step only one episode has: its own baseline, advantage 0; padding stays 0
    a = batch_baseline_advantages(g, mask)
    assert a.flatten().tolist() == pytest.approx([(2.75 - 5.0) / 2, 0.0, 0.0, (5.0 - 2.75) / 2, 0.0, 0.0])


def test_group_baseline_advantages_hand_values() -> None:
    # two groups of two: each episode's baseline is the other episode of its group
    a = group_baseline_advantages(torch.tensor([[3.0], [1.0], [5.0], [4.0]]), torch.ones(4, 1),
                                  torch.tensor([0, 0, 1, 1]))
    assert a.flatten().tolist() == [2.0, -2.0, 1.0, -1.0]
    # one group of three: the mean of the two others (leave-one-out)
    a = group_baseline_advantages(torch.tensor([[3.0], [1.0], [2.0]]), torch.ones(3, 1), torch.tensor([7, 7, 7]))
    assert a.flatten().tolist() == pytest.approx([1.5, -1.5, 0.0])
    # groups need not be contiguous; a step no other episode of the group has: 0; padding stays 0
    g = torch.tensor([[1.0, 2.0], [4.0, 9.0], [3.0, 0.0], [8.0, 8.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1]])
    a = group_baseline_advantages(g, mask, torch.tensor([0, 1, 0, 1]))
    assert a.tolist() == [[-2.0, 0.0], [-4.0, 1.0], [2.0, 0.0], [4.0, -1.0]]
    # one episode per group: no baseline, every advantage 0 (it must not become the batch baseline)
    assert group_baseline_advantages(g, mask, torch.arange(4)).abs().sum() == 0
    # with every episode in one group of two, it differs from the batch baseline by the factor n / (n - 1)
    two = torch.tensor([[3.0, 1.0], [1.0, 3.0]])
    assert (group_baseline_advantages(two, torch.ones(2, 2), torch.zeros(2)) ==
            2 * batch_baseline_advantages(two, torch.ones(2, 2))).all()
    with pytest.raises(ValueError, match="groups must have shape"):
        group_baseline_advantages(g, mask, torch.zeros(3))


def test_gae_hand_values() -> None:
    # rewards [0, 1], values [0.5, 0.8], gamma 1, lam 0.5:
    # delta = [0 + 0.8 - 0.5, 1 + 0 - 0.8] = [0.3, 0.2]; A = [0.3 + 0.5 * 0.2, 0.2] = [0.4, 0.2]; R = A + V
    adv, ret = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.8]]), torch.ones(1, 2), gamma=1.0, lam=0.5)
    assert adv.flatten().tolist() == pytest.approx([0.4, 0.2])
    assert ret.flatten().tolist() == pytest.approx([0.9, 1.0])
    # lam = 1 gives MC returns minus V; gamma 0.9, padding after one step in row 2
    r = torch.tensor([[1.0, 0.0, 2.0], [3.0, 9.0, 9.0]])
    v = torch.tensor([[0.2, 0.4, 0.6], [1.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv, ret = gae(r, v, mask, gamma=0.9, lam=1.0)
    mc = rewards_to_go(r, mask, 0.9)
    assert adv.flatten().tolist() == pytest.approx((mc - v * mask).flatten().tolist())
    assert ret.flatten().tolist() == pytest.approx(mc.flatten().tolist())
    # a truncated episode bootstraps from the given value: r = [1], V = [0.5], V(s_1) = 2, gamma 1 -> A = 2.5
    adv, _ = gae(torch.tensor([[1.0]]), torch.tensor([[0.5]]), torch.ones(1, 1), bootstrap=torch.tensor([2.0]))
    assert adv.item() == pytest.approx(2.5)
    # ... also where its row is padded: the last real step takes V(s_1) from bootstrap, not from the padding
    adv, _ = gae(torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[0.5, 0.0, 0.0]]), torch.tensor([[1, 0, 0]]),
                 gamma=1.0, lam=0.95, bootstrap=torch.tensor([2.0]))
    assert adv.flatten().tolist() == pytest.approx([2.5, 0.0, 0.0])

"""Losses for SFT, trajectory DPO (ETO), IPO, DMPO, SPPO and PPO (RLFT) as pure functions of tensors.

Every function here takes tensors and plain numbers and returns tensors: no models, no
tokenizers, no strings naming a method (the one exception is SPPO's ``variant``, which picks
between two targets of one formula). A trainer computes log-probs with a forward pass, calls
one of these, and reduces the result.

Conventions
-----------
* Notation follows ``DESIGN.md`` section 3: a trajectory has agent turns ``t = 0..T-1``;
  ``log pi(a_t|s_t)`` is the *sum* of token log-probs over the tokens of turn ``t``'s
  assistant message, and ``log pi(tau) = sum_t log pi(a_t|s_t)``.
* Preference losses return ``(losses, metrics)``: ``losses`` has one entry per sample (shape
  ``[B]``) so the trainer chooses the reduction (mean over the global batch, for exact
  gradient accumulation); ``metrics`` maps a name to a **detached per-sample tensor** of shape
  ``[B]``, so a trainer can concatenate them across micro-batches and processes before it
  averages. Metric names are shared by DPO, IPO and DMPO:

  ===================  =====================================================
  ``chosen_logratio``   ``log pi(y_w) - log pi_ref(y_w)`` (DMPO: phi-weighted sum)
  ``rejected_logratio`` the same for the rejected trajectory
  ``chosen_rewards``    ``beta * chosen_logratio`` (implicit reward)
  ``rejected_rewards``  ``beta * rejected_logratio``
  ``reward_margin``     ``chosen_rewards - rejected_rewards``
  ``accuracy``          ``1.0`` where ``reward_margin > 0`` else ``0.0``
  ===================  =====================================================

* Sums of log-probs are accumulated in at least float32 (bf16 inputs are promoted).
* Shape errors raise :class:`ValueError` naming the argument and both shapes.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "LossOutput",
    "batch_baseline_advantages",
    "dmpo_loss",
    "dmpo_weights",
    "dpo_loss",
    "full_kl",
    "gae",
    "group_baseline_advantages",
    "ipo_loss",
    "kl_penalty",
    "normalize_advantages",
    "ppo_loss",
    "ppo_policy_loss",
    "preference_metrics",
    "rewards_to_go",
    "sft_loss",
    "sppo_loss",
    "turn_logps",
    "turn_mask_from_counts",
    "value_loss",
]

LossOutput = tuple[Tensor, dict[str, Tensor]]
"""``(per-sample losses [B], {metric name: detached per-sample tensor [B]})``."""

# Below this distance from 1, DMPO's discount uses its exact limit (T - t) / T.
_GAMMA_ONE_TOL = 1e-6


# --------------------------------------------------------------------------------------------
# checks


def _same_shape(name_a: str, a: Tensor, name_b: str, b: Tensor) -> None:
    if a.shape != b.shape:
        raise ValueError(
            f"{name_b} has shape {tuple(b.shape)} but {name_a} has shape {tuple(a.shape)}; they must match"
        )


def _ndim(name: str, x: Tensor, ndim: int) -> None:
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")


def _positive(name: str, value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number, got {value}")


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype for log-prob sums: at least float32."""
    return torch.promote_types(dtype, torch.float32)


# --------------------------------------------------------------------------------------------
# SFT


def sft_loss(token_logps: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    r"""Summed negative log-likelihood of the action tokens.

    .. math::  L_{\text{sum}} = -\sum_i m_i \log \pi_\theta(x_i \mid x_{<i}),
               \qquad n = \sum_i m_i

    The caller divides ``loss_sum`` by the number of action tokens in the *whole* optimizer
    step (all micro-batches, all processes), not by ``num_tokens`` of this micro-batch, so
    that gradient accumulation gives exactly the per-token mean of one big batch.

    Args:
        token_logps: log-prob of each target token, any shape (e.g. ``[B, L]`` or packed ``[N]``).
        mask: same shape; nonzero (or ``True``) on action tokens. Masked-out positions may hold
            any value, ``-inf`` included; they never reach the loss or its gradient.

    Returns:
        ``(loss_sum, num_tokens)``: a float scalar (at least float32) and an int64 scalar.
    """
    _same_shape("token_logps", token_logps, "mask", mask)
    keep = mask.bool()
    logps = token_logps.to(_acc_dtype(token_logps.dtype))
    loss_sum = -torch.where(keep, logps, torch.zeros_like(logps)).sum()
    return loss_sum, keep.sum()


# --------------------------------------------------------------------------------------------
# per-turn log-probs


def turn_logps(
    token_logps: Tensor,
    turn_index: Tensor,
    seq_index: Tensor,
    num_seqs: int,
    max_turns: int,
) -> Tensor:
    r"""Sum token log-probs into per-sequence, per-turn log-probs.

    .. math::  \text{out}[s, t] = \sum_{i:\ \text{seq}_i = s,\ \text{turn}_i = t} \log p_i

    Tokens usually come from one forward pass over several sequences (padded and flattened, or
    packed). ``token_logps[i]`` must be the log-prob of the token whose turn is
    ``turn_index[i]`` (i.e. the caller has already applied the next-token shift). Tokens with
    ``turn_index == -1`` (prompt, observations, padding) are ignored, whatever value they hold.
    Implemented with one ``scatter_add`` and no host synchronisation except the range check.

    Args:
        token_logps: float, any shape; flattened.
        turn_index: integer, same shape; agent turn of each token, ``-1`` for non-agent tokens.
        seq_index: integer, same shape; the sequence (0..num_seqs-1) each token belongs to.
        num_seqs: number of sequences ``S``.
        max_turns: width ``T_max`` of the output.

    Returns:
        ``[num_seqs, max_turns]`` tensor (dtype at least float32); turns without tokens are 0.
    """
    _same_shape("token_logps", token_logps, "turn_index", turn_index)
    _same_shape("token_logps", token_logps, "seq_index", seq_index)
    if num_seqs < 0 or max_turns < 0:
        raise ValueError(f"num_seqs and max_turns must be >= 0, got {num_seqs} and {max_turns}")
    if turn_index.is_floating_point() or seq_index.is_floating_point():
        raise ValueError("turn_index and seq_index must be integer tensors")
    logps = token_logps.reshape(-1).to(_acc_dtype(token_logps.dtype))
    turns = turn_index.reshape(-1).long()
    seqs = seq_index.reshape(-1).long()
    valid = turns >= 0
    if logps.numel() and bool(
        ((turns >= max_turns) | (valid & ((seqs < 0) | (seqs >= num_seqs))) | (turns < -1)).any()
    ):
        raise ValueError(
            f"turn_index must lie in [-1, {max_turns}) and seq_index of agent tokens in [0, {num_seqs}); "
            f"got turn_index in [{int(turns.min())}, {int(turns.max())}], "
            f"seq_index in [{int(seqs.min())}, {int(seqs.max())}]"
        )
    flat = torch.where(valid, seqs * max_turns + turns, torch.zeros_like(turns))
    src = torch.where(valid, logps, torch.zeros_like(logps))
    out = logps.new_zeros(num_seqs * max_turns)
    if out.numel() == 0:
        return out.view(num_seqs, max_turns)
    return out.scatter_add(0, flat, src).view(num_seqs, max_turns)


def turn_mask_from_counts(num_turns: Tensor, max_turns: int) -> Tensor:
    """``mask[b, t] = t < num_turns[b]``: a ``[B, max_turns]`` bool tensor of real (non-padding) turns."""
    _ndim("num_turns", num_turns, 1)
    steps = torch.arange(max_turns, device=num_turns.device)
    return steps.unsqueeze(0) < num_turns.unsqueeze(1)


# --------------------------------------------------------------------------------------------
# DPO family


def preference_metrics(chosen_logratio: Tensor, rejected_logratio: Tensor, beta: float) -> dict[str, Tensor]:
    """Detached per-sample metrics shared by DPO, IPO and DMPO (see the module docstring)."""
    chosen = chosen_logratio.detach()
    rejected = rejected_logratio.detach()
    chosen_rewards = beta * chosen
    rejected_rewards = beta * rejected
    margin = chosen_rewards - rejected_rewards
    return {
        "chosen_logratio": chosen,
        "rejected_logratio": rejected,
        "chosen_rewards": chosen_rewards,
        "rejected_rewards": rejected_rewards,
        "reward_margin": margin,
        "accuracy": (margin > 0).to(chosen.dtype),
    }


def _pair_logratios(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
) -> tuple[Tensor, Tensor]:
    _same_shape("policy_chosen_logps", policy_chosen_logps, "policy_rejected_logps", policy_rejected_logps)
    _same_shape("policy_chosen_logps", policy_chosen_logps, "ref_chosen_logps", ref_chosen_logps)
    _same_shape("policy_chosen_logps", policy_chosen_logps, "ref_rejected_logps", ref_rejected_logps)
    return policy_chosen_logps - ref_chosen_logps, policy_rejected_logps - ref_rejected_logps


def _sigmoid_loss(h: Tensor, beta: float, label_smoothing: float) -> Tensor:
    logits = beta * h
    if label_smoothing == 0.0:
        return -F.logsigmoid(logits)
    return -(1.0 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)


def dpo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> LossOutput:
    r"""Trajectory DPO (ETO), optionally conservative (label-smoothed).

    With trajectory log-probs (sums over all agent-turn tokens)

    .. math::
        h = [\log\pi_\theta(\tau_w) - \log\pi_{ref}(\tau_w)] - [\log\pi_\theta(\tau_l) - \log\pi_{ref}(\tau_l)]

        L = -(1-\varepsilon)\log\sigma(\beta h) - \varepsilon\log\sigma(-\beta h)

    :math:`\varepsilon` = ``label_smoothing`` is the probability that a pair's label is flipped
    (conservative DPO, cDPO); ``0`` gives the DPO loss of the paper. Gradient w.r.t. ``h``:
    :math:`-\beta[(1-\varepsilon) - \sigma(\beta h)]`, so with :math:`\varepsilon>0` the loss
    stops pushing once :math:`\sigma(\beta h) = 1-\varepsilon`.

    Example: :math:`\beta=0.1`, chosen log-ratio ``1``, rejected ``-2``: :math:`h=3`,
    :math:`L=-\log\sigma(0.3)=\log(1+e^{-0.3})\approx 0.5544`.

    Args:
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps:
            ``[B]`` trajectory log-probs (any equal shapes are accepted).
        beta: inverse temperature :math:`\beta>0` (paper: 0.1; 0.5 on ALFWorld).
        label_smoothing: :math:`\varepsilon \in [0, 0.5)`.

    Returns:
        ``(losses [B], metrics)``; metrics as in the module docstring.
    """
    _positive("beta", beta)
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must lie in [0, 0.5), got {label_smoothing}")
    chosen, rejected = _pair_logratios(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    losses = _sigmoid_loss(chosen - rejected, beta, label_smoothing)
    return losses, preference_metrics(chosen, rejected, beta)


def chosen_nll(policy_chosen_logps: Tensor, chosen_tokens: Tensor) -> Tensor:
    r"""Per-token negative log-likelihood of the chosen side (RPO's added term).

    .. math::  L_{\text{NLL}} = -\frac{\log\pi_\theta(\tau_w)}{|\tau_w|}

    with :math:`\log\pi_\theta(\tau_w)` the trajectory log-prob (the sum over its agent-turn
    tokens) and :math:`|\tau_w|` its number of agent-turn tokens. Added as
    :math:`L = L_{pref} + \alpha L_{\text{NLL}}` (``PreferenceConfig.sft_weight`` = alpha;
    Pang et al. 2024, "Iterative Reasoning Preference Optimization"): it keeps the chosen
    side's likelihood from falling while the margin grows, DPO's known failure on small data.

    Example: log-prob ``-6`` over ``3`` tokens: :math:`L=2`.

    Args:
        policy_chosen_logps: ``[B]`` trajectory log-probs of the chosen side.
        chosen_tokens: ``[B]`` its agent-turn token counts (>= 1).
    """
    _same_shape("policy_chosen_logps", policy_chosen_logps, "chosen_tokens", chosen_tokens)
    if bool((chosen_tokens < 1).any()):
        raise ValueError("chosen_tokens must be >= 1")
    return -policy_chosen_logps / chosen_tokens.to(policy_chosen_logps.dtype)


def ipo_loss(
    policy_chosen_logps: Tensor,
    policy_rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float = 0.1,
) -> LossOutput:
    r"""IPO (Azar et al., 2023, eq. 17) on trajectory log-probs.

    .. math::  L = \left(h - \frac{1}{2\beta}\right)^2

    with :math:`h` as in :func:`dpo_loss` (here :math:`\beta` is IPO's :math:`\tau`). The log-ratios
    are **sums** over agent tokens, as ``DESIGN.md`` specifies; TRL's ``ipo`` divides each by its
    number of completion tokens first, so pass per-token averages to reproduce that variant.

    Example: :math:`\beta=0.5`, :math:`h=3`: :math:`L=(3-1)^2=4`.

    Returns:
        ``(losses [B], metrics)``; metrics as in the module docstring (rewards scaled by ``beta``).
    """
    _positive("beta", beta)
    chosen, rejected = _pair_logratios(
        policy_chosen_logps, policy_rejected_logps, ref_chosen_logps, ref_rejected_logps
    )
    losses = (chosen - rejected - 1.0 / (2.0 * beta)) ** 2
    return losses, preference_metrics(chosen, rejected, beta)


# --------------------------------------------------------------------------------------------
# DMPO


def dmpo_weights(
    num_turns: Tensor, max_turns: int, gamma: float, *, dtype: torch.dtype = torch.float32
) -> Tensor:
    r"""DMPO's discount function, one row per trajectory.

    .. math::
        \phi(t, T) = \frac{\gamma^t (1-\gamma^{T-t})}{1-\gamma^T}\ \ (t < T), \qquad \phi(t,T) = 0\ \ (t \ge T)

    It comes from the length-normalised discounted occupancy measure: the turn-``t`` log-ratio
    appears in the occupancy of every later state ``k >= t`` with weight
    :math:`\gamma^k(1-\gamma)/(1-\gamma^T)`, and :math:`\sum_{k=t}^{T-1}\gamma^k(1-\gamma) = \gamma^t(1-\gamma^{T-t})`.
    So :math:`\phi(0,T)=1` and :math:`\phi` decreases in ``t``. Limits, both handled exactly:

    * :math:`\gamma = 0`: :math:`\phi = 1` at ``t = 0`` and 0 elsewhere (DPO on the first action);
    * :math:`\gamma \to 1` (:math:`|1-\gamma| < 10^{-6}`): :math:`\phi = (T-t)/T`.

    Otherwise the powers are evaluated in log space,
    :math:`\phi = e^{t\ell}\,\mathrm{expm1}((T-t)\ell)/\mathrm{expm1}(T\ell)` with
    :math:`\ell=\log\gamma` taken in double precision, which keeps full relative precision
    in float32 even for :math:`\gamma` close to 1. Rows with ``T = 0`` are all zeros.

    Example: :math:`\gamma=0.5`, :math:`T=3`: :math:`\phi = [1,\ 0.5\cdot0.75/0.875,\ 0.25\cdot0.5/0.875]
    = [1, 3/7, 1/7]`.

    Args:
        num_turns: ``[B]`` integer number of agent turns of each trajectory.
        max_turns: width of the output (must be ``>= num_turns.max()`` for the weights to cover
            every turn; this function does not check it).
        gamma: discount :math:`\gamma \in [0, 1]`.
        dtype: output dtype (computation is in float32 or wider).

    Returns:
        ``[B, max_turns]`` weights, constant (no gradient).
    """
    _ndim("num_turns", num_turns, 1)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    work = _acc_dtype(dtype)
    t = torch.arange(max_turns, device=num_turns.device, dtype=work).unsqueeze(0)  # [1, M]
    big_t = num_turns.to(work).unsqueeze(1)  # [B, 1]
    real = t < big_t  # [B, M]
    zeros = torch.zeros((), device=num_turns.device, dtype=work)
    if gamma == 0.0:
        phi = torch.where(real & (t == 0), torch.ones((), device=num_turns.device, dtype=work), zeros)
    elif abs(1.0 - gamma) < _GAMMA_ONE_TOL:
        phi = torch.where(real, (big_t - t) / big_t.clamp(min=1.0), zeros)
    else:
        log_gamma = math.log(gamma)
        num = torch.exp(t * log_gamma) * torch.expm1((big_t - t) * log_gamma)
        den = torch.expm1(big_t.clamp(min=1.0) * log_gamma)
        phi = torch.where(real, num / den, zeros)
    return phi.to(dtype)


def _weighted_logratio(name: str, policy: Tensor, ref: Tensor, num_turns: Tensor, gamma: float) -> Tensor:
    """``sum_{t<T} phi(t, T) * (policy[:, t] - ref[:, t])``; padding turns never reach the result."""
    _ndim(f"policy_{name}_turn_logps", policy, 2)
    _same_shape(f"policy_{name}_turn_logps", policy, f"ref_{name}_turn_logps", ref)
    _ndim(f"{name}_num_turns", num_turns, 1)
    if num_turns.shape[0] != policy.shape[0]:
        raise ValueError(
            f"{name}_num_turns has shape {tuple(num_turns.shape)} but policy_{name}_turn_logps has "
            f"batch size {policy.shape[0]}; they must match"
        )
    if num_turns.is_floating_point():
        raise ValueError(f"{name}_num_turns must be an integer tensor")
    width = policy.shape[1]
    if num_turns.numel() and bool(((num_turns < 0) | (num_turns > width)).any()):
        raise ValueError(
            f"{name}_num_turns must lie in [0, {width}] (the width of policy_{name}_turn_logps), "
            f"got values in [{int(num_turns.min())}, {int(num_turns.max())}]"
        )
    work = _acc_dtype(policy.dtype)
    delta = policy.to(work) - ref.to(work)
    real = turn_mask_from_counts(num_turns, width)
    delta = torch.where(real, delta, torch.zeros_like(delta))  # padding may hold anything, even inf/nan
    phi = dmpo_weights(num_turns, width, gamma, dtype=work)
    return (phi * delta).sum(dim=1)


def dmpo_loss(
    policy_chosen_turn_logps: Tensor,
    policy_rejected_turn_logps: Tensor,
    ref_chosen_turn_logps: Tensor,
    ref_rejected_turn_logps: Tensor,
    chosen_num_turns: Tensor,
    rejected_num_turns: Tensor,
    *,
    beta: float = 0.1,
    gamma: float = 0.7,
) -> LossOutput:
    r"""DMPO: discounted, length-normalised multi-turn DPO (Shi et al., 2024, eq. 17).

    .. math::
        L = -\log\sigma\Big(\sum_{t<T_w}\beta\,\phi(t,T_w)\,\Delta_{w,t} - \sum_{t<T_l}\beta\,\phi(t,T_l)\,\Delta_{l,t}\Big),
        \qquad \Delta_t = \log\pi_\theta(a_t|s_t) - \log\pi_{ref}(a_t|s_t)

    with :math:`\phi` from :func:`dmpo_weights`; each trajectory uses its own length ``T``, so
    chosen and rejected may differ in length and in padded width (``Tc`` vs ``Tr``).
    Turn log-probs at ``t >= T`` (padding) are ignored whatever they hold.
    :math:`\gamma=0` is DPO on the first agent action; :math:`\gamma\to1` weighs turn ``t`` by
    :math:`(T-t)/T`. The authors' code defaults to :math:`\gamma=0.7`.

    Args:
        policy_chosen_turn_logps, ref_chosen_turn_logps: ``[B, Tc]`` per-turn log-probs
            (see :func:`turn_logps`).
        policy_rejected_turn_logps, ref_rejected_turn_logps: ``[B, Tr]``.
        chosen_num_turns, rejected_num_turns: ``[B]`` integer turn counts, ``<= Tc`` / ``<= Tr``.
        beta: :math:`\beta > 0`.
        gamma: :math:`\gamma \in [0, 1]`.

    Returns:
        ``(losses [B], metrics)``; the ``*_logratio`` metrics are the :math:`\phi`-weighted sums
        :math:`\sum_t \phi(t,T)\Delta_t` and the rewards are ``beta`` times those.
    """
    _positive("beta", beta)
    for name, x in (("chosen", policy_chosen_turn_logps), ("rejected", policy_rejected_turn_logps)):
        _ndim(f"policy_{name}_turn_logps", x, 2)
    if policy_chosen_turn_logps.shape[0] != policy_rejected_turn_logps.shape[0]:
        raise ValueError(
            f"policy_chosen_turn_logps has batch size {policy_chosen_turn_logps.shape[0]} but "
            f"policy_rejected_turn_logps has {policy_rejected_turn_logps.shape[0]}; they must match"
        )
    chosen = _weighted_logratio(
        "chosen", policy_chosen_turn_logps, ref_chosen_turn_logps, chosen_num_turns, gamma
    )
    rejected = _weighted_logratio(
        "rejected", policy_rejected_turn_logps, ref_rejected_turn_logps, rejected_num_turns, gamma
    )
    losses = -F.logsigmoid(beta * (chosen - rejected))
    return losses, preference_metrics(chosen, rejected, beta)


# --------------------------------------------------------------------------------------------
# SPPO


def sppo_loss(
    policy_logps: Tensor,
    ref_logps: Tensor,
    win_rates: Tensor | None,
    *,
    eta: float,
    variant: Literal["soft", "hard"] = "soft",
    is_chosen: Tensor | None = None,
) -> LossOutput:
    r"""SPPO's squared loss (Wu et al., 2024, eq. 3.6), one sample at a time.

    .. math::  L(y) = \Big(\log\frac{\pi_\theta(y)}{\pi_t(y)} - \eta\,\big(\hat P(y \succ \pi_t) - \tfrac12\big)\Big)^2

    ``ref_logps`` are the log-probs under :math:`\pi_t`, the policy at the start of the
    iteration; for multi-turn samples both are sums over agent-turn tokens. The constant
    :math:`\eta/2` replaces :math:`\log Z` (the paper's approximation), so a sample with win
    rate 1/2 is left where it is.

    * ``variant="soft"``: :math:`\hat P` = ``win_rates`` (e.g. the mean of
      :math:`P(y \succ y_k)` over the K samples of the task).
    * ``variant="hard"``: :math:`\hat P` = 1 where ``is_chosen`` (winner), 0 otherwise, i.e.
      targets :math:`+\eta/2` and :math:`-\eta/2`; ``win_rates`` is ignored and may be ``None``.

    Relation to TRL: ``DPOTrainer`` with ``loss_type="sppo_hard"`` computes, per pair,
    :math:`(\ell_w - \tfrac{1}{2\beta})^2 + (\ell_l + \tfrac{1}{2\beta})^2`; that is the sum of
    this function's hard losses on the winner and the loser with :math:`\eta = 1/\beta`
    (the SPPO authors' code likewise passes :math:`\beta = 1/\eta`). This function implements
    the paper's / ``DESIGN.md``'s form with :math:`\eta` directly.

    Example: :math:`\eta=2`, log-ratio 0.3, :math:`\hat P=0.8`: target :math:`2\cdot0.3=0.6`,
    :math:`L=(0.3-0.6)^2=0.09`.

    Args:
        policy_logps, ref_logps: ``[B]`` sequence log-probs.
        win_rates: ``[B]`` in [0, 1] for ``"soft"``.
        eta: :math:`\eta > 0`.
        variant: ``"soft"`` or ``"hard"``.
        is_chosen: ``[B]`` bool, required for ``"hard"``.

    Returns:
        ``(losses [B], metrics)`` with detached per-sample ``logratio``
        (:math:`\log\pi_\theta/\pi_t`), ``win_rate`` (:math:`\hat P` used), ``target``
        (:math:`\eta(\hat P - 1/2)`) and ``error`` (``logratio - target``).
    """
    _positive("eta", eta)
    _same_shape("policy_logps", policy_logps, "ref_logps", ref_logps)
    if variant == "soft":
        if win_rates is None:
            raise ValueError("sppo_loss(variant='soft') needs win_rates")
        _same_shape("policy_logps", policy_logps, "win_rates", win_rates)
        p_hat = win_rates.to(policy_logps.dtype)
    elif variant == "hard":
        if is_chosen is None:
            raise ValueError("sppo_loss(variant='hard') needs is_chosen (True for winners, False for losers)")
        _same_shape("policy_logps", policy_logps, "is_chosen", is_chosen)
        p_hat = is_chosen.bool().to(policy_logps.dtype)
    else:
        raise ValueError(f"sppo_loss variant must be 'soft' or 'hard', got {variant!r}")
    logratio = policy_logps - ref_logps
    target = eta * (p_hat - 0.5)
    error = logratio - target
    metrics = {
        "logratio": logratio.detach(),
        "win_rate": p_hat.detach(),
        "target": target.detach(),
        "error": error.detach(),
    }
    return error**2, metrics


# ============================================================================================
# ArCHer (seed 003): utterance-level double critic and token-level actor.
# (Appended section; the names are added to ``__all__`` at its end.)
#
# Per-sample conventions as above: every function returns ``(losses [B], metrics)`` with
# detached per-sample metric tensors; targets are detached inside (no gradient flows into a
# target network's output or into the advantage).


def archer_q_loss(
    q1: Tensor,
    q2: Tensor,
    reward: Tensor,
    done: Tensor,
    target_v1_next: Tensor,
    target_v2_next: Tensor,
    gamma: float,
) -> tuple[Tensor, dict[str, Tensor]]:
    r"""TD loss of ArCHer's twin Q heads against the target V heads (DESIGN 3, ArCHer).

    .. math::
        y_i = r + \gamma (1 - d)\, \bar V_i(s'), \qquad
        L = (Q_1(s,a) - y_1)^2 + (Q_2(s,a) - y_2)^2

    Each twin regresses on its own target twin (as the authors' code does); ``done`` is 1
    for a terminal transition (no bootstrap), 0 otherwise -- a truncated episode's last
    transition is *not* done.

    Args:
        q1, q2: ``[B]`` online Q heads at (s, a).
        reward, done: ``[B]`` float (``done`` in {0, 1}).
        target_v1_next, target_v2_next: ``[B]`` target V heads at s' (detached here).
        gamma: discount in [0, 1].

    Returns:
        ``(losses [B], metrics)`` with ``q1``, ``q2``, ``target_q1`` (= y_1), ``target_q2``, ``td_error1``.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    for name, x in (("q2", q2), ("reward", reward), ("done", done), ("target_v1_next", target_v1_next),
                    ("target_v2_next", target_v2_next)):
        _same_shape("q1", q1, name, x)
    _ndim("q1", q1, 1)
    work = _acc_dtype(q1.dtype)  # targets and errors in at least float32 (bf16 heads under autocast)
    q1, q2 = q1.to(work), q2.to(work)
    not_done = 1.0 - done.to(work)
    y1 = (reward.to(work) + gamma * not_done * target_v1_next.to(work)).detach()
    y2 = (reward.to(work) + gamma * not_done * target_v2_next.to(work)).detach()
    losses = (q1 - y1) ** 2 + (q2 - y2) ** 2
    metrics = {"q1": q1.detach(), "q2": q2.detach(), "target_q1": y1, "target_q2": y2,
               "td_error1": (q1 - y1).detach()}
    return losses, metrics


def archer_v_loss(
    v1: Tensor,
    v2: Tensor,
    target_q1: Tensor,
    target_q2: Tensor,
    *,
    use_min: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    r"""Loss of ArCHer's twin V heads against the target Q heads at an actor sample.

    .. math::
        \hat a \sim \pi(\cdot|s):\quad
        L = (V_1(s) - \bar Q_1(s,\hat a))^2 + (V_2(s) - \bar Q_2(s,\hat a))^2

    (each twin against its own target twin, as in DESIGN 3 and the authors' code). With
    ``use_min`` both twins regress on :math:`\min(\bar Q_1, \bar Q_2)(s,\hat a)` instead (the
    clipped double-Q target of TD3/SAC).

    Returns:
        ``(losses [B], metrics)`` with ``v1``, ``v2``, ``target_v1``, ``target_v2``.
    """
    for name, x in (("v2", v2), ("target_q1", target_q1), ("target_q2", target_q2)):
        _same_shape("v1", v1, name, x)
    _ndim("v1", v1, 1)
    work = _acc_dtype(v1.dtype)
    v1, v2 = v1.to(work), v2.to(work)
    t1, t2 = target_q1.to(work).detach(), target_q2.to(work).detach()
    if use_min:
        t1 = t2 = torch.minimum(t1, t2)
    losses = (v1 - t1) ** 2 + (v2 - t2) ** 2
    return losses, {"v1": v1.detach(), "v2": v2.detach(), "target_v1": t1, "target_v2": t2}


def archer_advantage(q1: Tensor, q2: Tensor, v1: Tensor, v2: Tensor) -> Tensor:
    r"""ArCHer's utterance-level advantage, detached: :math:`A = \min(Q_1, Q_2) - \min(V_1, V_2)`."""
    for name, x in (("q2", q2), ("v1", v1), ("v2", v2)):
        _same_shape("q1", q1, name, x)
    return (torch.minimum(q1, q2) - torch.minimum(v1, v2)).detach()


def archer_actor_loss(
    token_logps: Tensor,
    mask: Tensor,
    value: Tensor,
    baseline: Tensor,
) -> tuple[Tensor, dict[str, Tensor]]:
    r"""Token-level policy gradient with the utterance critic's advantage (ArCHer's actor).

    .. math::
        L_b = -\sum_h m_{bh}\,(q_b - c_{bh})\,\log\pi(\hat a_b^h \mid s_b, \hat a_b^{<h})

    ``value`` is :math:`q_b = \min(Q_1, Q_2)(s_b, \hat a_b)`. ``baseline`` is either ``[B]``,
    the utterance baseline :math:`c_{bh} = \min(V_1, V_2)(s_b)` for every token (ArCHer's
    default: the weight is the advantage :math:`A_b` and
    :math:`L_b = -A_b \sum_h \log\pi(\hat a_b^h|\cdot)`), or ``[B, H]``, a token-level
    baseline :math:`c_{bh} = b(s_b, \hat a_b^{<h})` (the paper's variance-reduction option).
    Weights are detached: the gradient flows through the log-probs only.

    Args:
        token_logps: ``[B, H]`` log-probs of the sampled utterance's tokens (padding anywhere
            ``mask`` is 0).
        mask: ``[B, H]`` 1 on real tokens.
        value: ``[B]``.
        baseline: ``[B]`` or ``[B, H]``.

    Returns:
        ``(losses [B], metrics)`` with ``advantage`` (:math:`q_b -` mean masked baseline) and
        ``logp`` (the utterance log-prob, summed over tokens).
    """
    _same_shape("token_logps", token_logps, "mask", mask)
    _ndim("token_logps", token_logps, 2)
    _ndim("value", value, 1)
    if value.shape[0] != token_logps.shape[0]:
        raise ValueError(f"value has shape {tuple(value.shape)}, token_logps {tuple(token_logps.shape)}")
    dtype = _acc_dtype(token_logps.dtype)
    m = mask.to(dtype)
    if baseline.dim() == 1:
        _same_shape("value", value, "baseline", baseline)
        base = baseline.to(dtype).unsqueeze(1).expand_as(m)
    else:
        _same_shape("token_logps", token_logps, "baseline", baseline)
        base = baseline.to(dtype)
    weight = (value.to(dtype).unsqueeze(1) - base).detach()
    logp = torch.where(m > 0, token_logps.to(dtype), torch.zeros_like(m))
    losses = -(m * weight * logp).sum(dim=1)
    mean_weight = (m * weight).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)
    return losses, {"advantage": mean_weight.detach(), "logp": logp.sum(dim=1).detach()}


__all__ += ["archer_actor_loss", "archer_advantage", "archer_q_loss", "archer_v_loss"]


# --------------------------------------------------------------------------------------------
# PPO (RLFT, seed 004): clipped surrogate, KL to the reference, value loss, advantages
#
# Token-level tensors are flat ``[N]`` (one entry per action token of a packed batch); the
# per-token advantage is its turn's advantage broadcast to the turn's tokens.

KLEstimator = Literal["k1", "k3"]
KLGradient = Literal["pathwise", "full"]


def ppo_policy_loss(logps: Tensor, old_logps: Tensor, advantages: Tensor, *, clip_eps: float = 0.2) -> LossOutput:
    r"""PPO's clipped surrogate, per token (Schulman et al., 2017, eq. 7).

    .. math::
        \rho = \exp(\log\pi_\theta - \log\pi_{old}), \qquad
        L = -\min\big(\rho A,\ \mathrm{clip}(\rho, 1-\epsilon, 1+\epsilon) A\big)

    Gradient flows only through ``logps``. Example: :math:`\epsilon=0.2`, :math:`A=1`,
    :math:`\rho=1.5` -> clipped, :math:`L=-1.2` (no gradient); :math:`A=-1`, :math:`\rho=1.5`
    -> :math:`L=1.5` (the pessimistic, unclipped branch).

    Args:
        logps: ``[N]`` log-probs of the taken tokens under :math:`\pi_\theta` (with grad).
        old_logps: ``[N]`` log-probs under the policy that sampled them.
        advantages: ``[N]`` advantage of each token (its turn's).
        clip_eps: :math:`\epsilon \ge 0`.

    Returns:
        ``(losses [N], metrics)`` with detached per-token ``ratio``, ``clipped`` (1.0 where the
        clipped branch is the minimum and differs from the unclipped one, i.e. no gradient)
        and ``approx_kl`` (:math:`(\rho-1)-\log\rho`, the k3 estimate of
        :math:`KL(\pi_{old}\|\pi_\theta)`, 0 at :math:`\rho=1`).
    """
    _same_shape("logps", logps, "old_logps", old_logps)
    _same_shape("logps", logps, "advantages", advantages)
    if not (clip_eps >= 0 and math.isfinite(clip_eps)):
        raise ValueError(f"clip_eps must be a finite number >= 0, got {clip_eps}")
    work = _acc_dtype(logps.dtype)
    log_ratio = logps.to(work) - old_logps.to(work).detach()
    ratio = torch.exp(log_ratio)
    adv = advantages.to(work).detach()
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * adv
    losses = -torch.minimum(unclipped, clipped)
    lr = log_ratio.detach()
    metrics = {
        "ratio": ratio.detach(),
        "clipped": (clipped < unclipped).to(work).detach(),
        "approx_kl": (torch.exp(lr) - 1.0) - lr,
    }
    return losses, metrics


def kl_penalty(logps: Tensor, ref_logps: Tensor, estimator: KLEstimator = "k3",
               gradient: KLGradient = "pathwise") -> Tensor:
    r"""Per-token estimate :math:`k` of :math:`KL(\pi_\theta\|\pi_{ref})` from a token :math:`x \sim \pi_\theta`.

    With :math:`\delta = \log\pi_{ref}(x) - \log\pi_\theta(x)`:

    * ``k1``: :math:`-\delta` (unbiased, can be negative, high variance);
    * ``k3``: :math:`e^{\delta} - 1 - \delta` (Schulman's low-variance estimator, unbiased; >= 0,
      0 iff the two log-probs agree; what GRPO uses).

    The value is :math:`k` either way; ``gradient`` sets what its gradient estimates, since the
    token was drawn from :math:`\pi_\theta` itself:

    * ``pathwise``: :math:`\nabla k` through ``logps`` alone. In expectation this is
      :math:`\nabla KL(\pi_{ref}\|\pi_\theta)` for k3 (:math:`\nabla k_3 = (1 - e^{\delta})\nabla\log\pi_\theta`,
      and :math:`E_{\pi_\theta}[e^{\delta}\nabla\log\pi_\theta] = \nabla\sum_x\pi_{ref}\log\pi_\theta`) and 0 for k1.
    * ``full``: :math:`\nabla k + k\,\nabla\log\pi_\theta` (the score-function term added), whose
      expectation is :math:`\nabla E_{\pi_\theta}[k] = \nabla KL(\pi_\theta\|\pi_{ref})` for both;
      returned as :math:`k + \mathrm{sg}(k)(\log\pi_\theta - \mathrm{sg}(\log\pi_\theta))`.

    Example: :math:`\log\pi_\theta=-1`, :math:`\log\pi_{ref}=-2` -> :math:`\delta=-1`: k1 = 1,
    k3 = :math:`e^{-1}` ≈ 0.3679; d k3 / d log pi_theta = 1 - e^{-1} ≈ 0.6321 (pathwise) and
    0.6321 + 0.3679 = 1 (full).

    Returns:
        ``[N]`` per-token values (float32 or wider).
    """
    _same_shape("logps", logps, "ref_logps", ref_logps)
    if gradient not in ("pathwise", "full"):
        raise ValueError(f"kl gradient must be 'pathwise' or 'full', got {gradient!r}")
    work = _acc_dtype(logps.dtype)
    lp = logps.to(work)
    delta = ref_logps.to(work).detach() - lp
    if estimator == "k1":
        k = -delta
    elif estimator == "k3":
        k = torch.expm1(delta) - delta
    else:
        raise ValueError(f"kl estimator must be 'k1' or 'k3', got {estimator!r}")
    return k + k.detach() * (lp - lp.detach()) if gradient == "full" else k


def full_kl(logprobs: Tensor, ref_logprobs: Tensor) -> Tensor:
    r"""Exact per-position :math:`KL(\pi_\theta\|\pi_{ref}) = \sum_v \pi_\theta(v)\,[\log\pi_\theta(v) - \log\pi_{ref}(v)]`
    over the whole vocabulary (the full-vocabulary option of the KL penalty).

    Example: :math:`\pi_\theta=(1/2, 1/2)`, :math:`\pi_{ref}=(1/4, 3/4)`:
    :math:`\tfrac12\log 2 + \tfrac12\log\tfrac23` ≈ 0.1438.

    Args:
        logprobs: ``[N, V]`` normalized log-probabilities of the policy (with grad).
        ref_logprobs: ``[N, V]`` of the reference (no grad taken).

    Returns:
        ``[N]`` KL values (>= 0 up to rounding).
    """
    _same_shape("logprobs", logprobs, "ref_logprobs", ref_logprobs)
    _ndim("logprobs", logprobs, 2)
    work = _acc_dtype(logprobs.dtype)
    lp = logprobs.to(work)
    return (lp.exp() * (lp - ref_logprobs.to(work).detach())).sum(dim=-1)


def ppo_loss(
    logps: Tensor,
    old_logps: Tensor,
    advantages: Tensor,
    *,
    clip_eps: float = 0.2,
    beta_kl: float = 0.05,
    ref_logps: Tensor | None = None,
    kl_estimator: KLEstimator = "k3",
    kl_gradient: KLGradient = "pathwise",
    logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
) -> LossOutput:
    r"""Token-level PPO objective of RLFT (DESIGN 3): clipped surrogate plus a KL penalty.

    .. math::  L_i = -\min(\rho_i A_i,\ \mathrm{clip}(\rho_i, 1\pm\epsilon) A_i) + \beta_{KL}\,\widehat{KL}_i

    :math:`\widehat{KL}_i` is :func:`kl_penalty` of the sampled token (``ref_logps`` given,
    estimator ``kl_estimator``, gradient ``kl_gradient``) or, when ``logprobs`` and ``ref_logprobs`` (``[N, V]``) are
    given, the exact full-vocabulary :func:`full_kl`. With ``beta_kl = 0`` no reference is
    needed. The caller sums the per-token losses over the global batch and divides by its
    number of action tokens.

    Example: :math:`\rho = 1` (first minibatch), :math:`A=0.5`, :math:`\log\pi_\theta=\log\pi_{ref}`:
    :math:`L = -0.5`, ``kl`` 0, ``ratio`` 1, ``clipped`` 0.

    Returns:
        ``(losses [N], metrics)``: the metrics of :func:`ppo_policy_loss` plus ``kl``
        (the detached KL term per token, 0 when not computed) and ``pg_loss``.
    """
    pg, metrics = ppo_policy_loss(logps, old_logps, advantages, clip_eps=clip_eps)
    if beta_kl < 0 or not math.isfinite(beta_kl):
        raise ValueError(f"beta_kl must be a finite number >= 0, got {beta_kl}")
    if logprobs is not None or ref_logprobs is not None:
        if logprobs is None or ref_logprobs is None:
            raise ValueError("the full-vocabulary KL needs both logprobs and ref_logprobs")
        if logprobs.shape[0] != logps.shape[0]:
            raise ValueError(
                f"logprobs has {logprobs.shape[0]} rows but logps has {logps.shape[0]} tokens; they must match"
            )
        kl = full_kl(logprobs, ref_logprobs)
    elif ref_logps is not None:
        kl = kl_penalty(logps, ref_logps, kl_estimator, kl_gradient)
    elif beta_kl > 0:
        raise ValueError("beta_kl > 0 needs ref_logps (or logprobs and ref_logprobs for the full-vocabulary KL)")
    else:
        kl = torch.zeros_like(pg)
    losses = pg + beta_kl * kl
    metrics["kl"] = kl.detach()
    metrics["pg_loss"] = pg.detach()
    return losses, metrics


def value_loss(
    values: Tensor, returns: Tensor, *, old_values: Tensor | None = None, clip: float | None = None
) -> LossOutput:
    r"""Squared-error value loss, optionally clipped around the old values (PPO2 style).

    .. math::
        L = \tfrac12 (V - R)^2; \qquad \text{clipped: } L = \tfrac12\max\big((V-R)^2,\
        (V_{old} + \mathrm{clip}(V - V_{old}, -c, c) - R)^2\big)

    Example: :math:`V=2, V_{old}=1, R=3, c=0.5`: unclipped :math:`(2-3)^2=1`, clipped
    :math:`(1.5-3)^2=2.25`, so :math:`L = 1.125`.

    Returns:
        ``(losses [B], {"value_error": V - R detached, "value_clipped": 0/1})``.
    """
    _same_shape("values", values, "returns", returns)
    work = _acc_dtype(values.dtype)
    v = values.to(work)
    r = returns.to(work).detach()
    err = (v - r) ** 2
    was_clipped = torch.zeros_like(err)
    if clip is not None:
        if old_values is None:
            raise ValueError("a clipped value loss needs old_values")
        _same_shape("values", values, "old_values", old_values)
        if not clip > 0:
            raise ValueError(f"value clip must be > 0, got {clip}")
        vo = old_values.to(work).detach()
        v_clip = vo + torch.clamp(v - vo, -clip, clip)
        err_clip = (v_clip - r) ** 2
        was_clipped = (err_clip > err).to(work)
        err = torch.maximum(err, err_clip)
    return 0.5 * err, {"value_error": (v - r).detach(), "value_clipped": was_clipped.detach()}


def rewards_to_go(rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    r"""Monte-Carlo returns :math:`G_t = \sum_{k \ge t} \gamma^{k-t} r_k` per episode.

    Args:
        rewards: ``[B, T]`` per-step rewards (padding may hold anything).
        mask: ``[B, T]`` 1 on real steps; an episode's steps are a prefix of its row.
        gamma: discount in [0, 1].

    Example: rewards ``[1, 2, 3]``, :math:`\gamma = 0.5`: :math:`G = [1+1+0.75, 2+1.5, 3] = [2.75, 3.5, 3]`.

    Returns:
        ``[B, T]`` returns, 0 on padding.
    """
    _same_shape("rewards", rewards, "mask", mask)
    _ndim("rewards", rewards, 2)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    m = mask.to(_acc_dtype(rewards.dtype))
    r = torch.where(mask.bool(), rewards.to(m.dtype), torch.zeros_like(m))
    out = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        running = r[:, t] + gamma * running * m[:, t]
        out[:, t] = running
    return out * m


def normalize_advantages(adv: Tensor, mode: str) -> Tensor:
    r"""Advantages as they are (``none``), centred (``center``) or whitened (``whiten``).

    .. math::  \text{center}: A_i - \bar A, \qquad
               \text{whiten}: (A_i - \bar A) / \sigma_A

    with :math:`\sigma_A` the population standard deviation of the batch; a batch with
    :math:`\sigma_A \le 10^{-6}` (constant) whitens to all zeros. PPO whitens its advantages
    over a batch (``adv_norm``); ArCHer's ``advantage_norm`` chooses: while its critic is still
    learning, ``min V(s)`` lags ``min Q(s, a_hat)`` (V regresses on the *target* Q), the raw
    advantages of a batch share one sign, and ``-A log pi`` with a negative mean pushes down
    every sampled reply; centring keeps only the critic's ranking.

    Example: ``[-1, -2, -3, -6]`` centres to ``[2, 1, 0, -3]`` and whitens to that over
    :math:`\sqrt{14/4}`.
    """
    if mode == "none" or adv.numel() == 0:
        return adv
    if mode not in ("center", "whiten"):
        raise ValueError(f"advantage_norm must be none, center or whiten (got {mode!r})")
    out = adv - adv.mean()
    if mode == "whiten":
        std = out.std(unbiased=False) if out.numel() > 1 else out.new_zeros(())
        out = out / std if float(std) > 1e-6 else torch.zeros_like(out)
    return out


def batch_baseline_advantages(returns: Tensor, mask: Tensor) -> Tensor:
    r"""Monte-Carlo advantages with a batch baseline: :math:`A_{i,t} = G_{i,t} - \bar G_t`,
    :math:`\bar G_t` the mean of :math:`G_{\cdot,t}` over the episodes of the batch that have a
    step ``t`` (for fixed-length episodes: every episode). A step no other episode shares gets
    advantage 0 from a baseline equal to itself.

    Example: :math:`G = [[3, 1], [1, 3]]`: :math:`\bar G = [2, 2]`, :math:`A = [[1, -1], [-1, 1]]`.

    Returns:
        ``[B, T]`` advantages, 0 on padding.
    """
    _same_shape("returns", returns, "mask", mask)
    _ndim("returns", returns, 2)
    m = mask.to(_acc_dtype(returns.dtype))
    g = torch.where(mask.bool(), returns.to(m.dtype), torch.zeros_like(m))
    baseline = g.sum(dim=0) / m.sum(dim=0).clamp(min=1.0)
    return (g - baseline.unsqueeze(0)) * m


def group_baseline_advantages(returns: Tensor, mask: Tensor, groups: Tensor) -> Tensor:
    r"""Monte-Carlo advantages with a leave-one-out baseline within groups of episodes of one task
    (RLOO, Kool et al., 2019; GRPO's groups without its division by the group's std):

    .. math::
        A_{i,t} = G_{i,t} - \frac{1}{|N_{i,t}|} \sum_{j \in N_{i,t}} G_{j,t},

    :math:`N_{i,t}` the other episodes of :math:`i`'s group (``groups[i]``) that have a step ``t``.
    The baseline does not depend on episode :math:`i`'s own actions, so the gradient stays unbiased,
    and what the group's episodes share (the task; on the bandits, the whole reward table) cancels.
    A step no other episode of its group shares gets advantage 0.

    Example: :math:`G = [[3], [1], [5], [4]]`, groups ``[0, 0, 1, 1]``: :math:`A = [[2], [-2], [1], [-1]]`;
    with three episodes :math:`G = [[3], [1], [2]]` in one group, :math:`A = [[1.5], [-1.5], [0]]`.

    Args:
        returns: ``[B, T]`` returns-to-go.
        mask: ``[B, T]``, 1 on real steps.
        groups: ``[B]`` integer group of each episode.

    Returns:
        ``[B, T]`` advantages, 0 on padding.
    """
    _same_shape("returns", returns, "mask", mask)
    _ndim("returns", returns, 2)
    if groups.shape != returns.shape[:1]:
        raise ValueError(f"groups must have shape [{returns.shape[0]}], got {list(groups.shape)}")
    m = mask.to(_acc_dtype(returns.dtype))
    g = torch.where(mask.bool(), returns.to(m.dtype), torch.zeros_like(m))
    same = (groups.unsqueeze(0) == groups.unsqueeze(1)).to(m.dtype)  # [B, B]
    total, count = same @ g - g, same @ m - m  # the other episodes of the group, step by step
    baseline = torch.where(count > 0, total / count.clamp(min=1.0), g)
    return (g - baseline) * m


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float = 1.0, lam: float = 0.95,
    bootstrap: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Generalized advantage estimation (Schulman et al., 2016).

    .. math::
        \delta_t = r_t + \gamma V(s_{t+1}) - V(s_t), \qquad
        A_t = \sum_{k \ge 0} (\gamma\lambda)^k \delta_{t+k}, \qquad R_t = A_t + V(s_t)

    :math:`V(s_T)` after an episode's last step is ``bootstrap`` (``[B]``; 0 for terminated
    episodes, the default).

    Example: rewards ``[0, 1]``, values ``[0.5, 0.8]``, :math:`\gamma=1, \lambda=0.5`:
    :math:`\delta = [0 + 0.8 - 0.5, 1 + 0 - 0.8] = [0.3, 0.2]`, :math:`A = [0.3 + 0.5\cdot0.2, 0.2] = [0.4, 0.2]`,
    :math:`R = [0.9, 1.0]`.

    Args:
        rewards, values, mask: ``[B, T]``; an episode's steps are a prefix of its row.

    Returns:
        ``(advantages [B, T], returns [B, T])``, 0 on padding.
    """
    _same_shape("rewards", rewards, "values", values)
    _same_shape("rewards", rewards, "mask", mask)
    _ndim("rewards", rewards, 2)
    if not 0.0 <= gamma <= 1.0 or not 0.0 <= lam <= 1.0:
        raise ValueError(f"gamma and lam must lie in [0, 1], got {gamma} and {lam}")
    work = _acc_dtype(rewards.dtype)
    m = mask.to(work)
    r = torch.where(mask.bool(), rewards.to(work), torch.zeros_like(m))
    v = torch.where(mask.bool(), values.to(work).detach(), torch.zeros_like(m))
    b, width = r.shape
    last = torch.zeros(b, dtype=work, device=r.device) if bootstrap is None else bootstrap.to(work).detach()
    adv = torch.zeros_like(r)
    running = torch.zeros(b, dtype=work, device=r.device)
    for t in range(width - 1, -1, -1):
        has_next = m[:, t + 1] if t + 1 < width else torch.zeros_like(m[:, t])
        next_v = torch.where(has_next.bool(), v[:, t + 1] if t + 1 < width else last, last)
        delta = r[:, t] + gamma * next_v - v[:, t]
        running = delta + gamma * lam * running * has_next
        adv[:, t] = running * m[:, t]
    return adv, (adv + v) * m

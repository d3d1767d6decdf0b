"""Policies and action heads (`grpo_trainer.algorithm.policy`) against `torch.distributions`."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn
from torch.distributions import Categorical, Normal

import fruit_env  # noqa: F401  (registers FruitCatcher-v0)
from grpo_trainer.algorithm.policy import (
    CPU_PASS_ROWS,
    AutocastPolicy,
    CategoricalHead,
    GaussianHead,
    MultiCategoricalHead,
    Policy,
    Tanh,
    build_policy,
    capped_logits,
    is_image_space,
    make_head,
)
from grpo_trainer.base.config import GRPOConfig

BATCH = 256


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# -- Discrete ----------------------------------------------------------------------------------


def test_categorical_log_prob_and_entropy_match_torch() -> None:
    """log_prob_entropy equals Categorical(logits).log_prob / entropy on random inputs."""
    head = make_head(gym.spaces.Discrete(5))
    assert isinstance(head, CategoricalHead)
    g = _gen()
    params = torch.randn(BATCH, 5, generator=g) * 3
    action = torch.randint(0, 5, (BATCH,), generator=g).to(head.action_dtype)
    logp, entropy = head.log_prob_entropy(params, action)
    dist = Categorical(logits=params)
    torch.testing.assert_close(logp, dist.log_prob(action.long()))
    torch.testing.assert_close(entropy, dist.entropy())


def test_categorical_sample_is_valid_and_its_logp_is_the_log_prob() -> None:
    """Sampling from uniform noise gives in-range actions whose logp is their log-prob."""
    head = make_head(gym.spaces.Discrete(5))
    g = _gen(1)
    params = torch.randn(BATCH, 5, generator=g) * 3
    noise = head.noise(BATCH, g, torch.device("cpu"))
    assert noise.shape == (BATCH, 5) and bool(((noise >= 0) & (noise < 1)).all())
    action, logp = head.sample(params, noise)
    assert action.shape == (BATCH,)
    assert bool(((action >= 0) & (action < 5)).all())
    torch.testing.assert_close(logp, head.log_prob_entropy(params, action)[0])
    # The noise is the only randomness: the same noise gives the same actions.
    assert torch.equal(head.sample(params, noise)[0], action)


def test_categorical_sampling_follows_the_distribution() -> None:
    """Gumbel-max with uniform noise samples Categorical(softmax(logits)).

    With n draws, each action's frequency has standard error sqrt(p (1 - p) / n); every
    frequency must lie within 5 of them (a false alarm has probability below 1e-5).
    """
    n = 20_000
    head = make_head(gym.spaces.Discrete(4))
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0])
    action, _ = head.sample(logits.expand(n, 4), head.noise(n, _gen(2), torch.device("cpu")))
    freq = torch.bincount(action, minlength=4).double() / n
    p = torch.softmax(logits.double(), -1)
    se = (p * (1 - p) / n).sqrt()
    assert bool(((freq - p).abs() < 5 * se).all()), (freq, p)


def test_logit_cap_bounds_the_log_prob_gap_and_keeps_the_greedy_order() -> None:
    """With `logit_cap` c, no action's log-prob falls more than 2c below another's, however
    sharp the raw logits; near zero the cap is the identity; the greedy action is the raw
    argmax even where tanh saturates two logits to the same float."""
    cap = 10.0
    head = make_head(gym.spaces.Discrete(3), logit_cap=cap)
    sharp = torch.tensor([[200.0, -200.0, 0.0]])
    logp, _ = head.log_prob_entropy(sharp.expand(3, 3), torch.arange(3, dtype=torch.uint8))
    gaps = logp.max() - logp
    assert float(gaps.max()) <= 2 * cap + 1e-4 and float(gaps.max()) > 2 * cap - 1e-3
    raw, _ = make_head(gym.spaces.Discrete(3)).log_prob_entropy(sharp, torch.tensor([1]))
    assert float(raw) < -399  # the uncapped head lets it fall 400 nats
    small = torch.randn(BATCH, 3, generator=_gen(4)) * 1e-3
    action = torch.randint(0, 3, (BATCH,), generator=_gen(5))
    torch.testing.assert_close(
        head.log_prob_entropy(small, action)[0],
        Categorical(logits=small).log_prob(action),
        rtol=0,
        atol=1e-5,
    )
    saturated = torch.tensor([[300.0, 301.0, -5.0]])
    assert torch.equal(capped_logits(saturated, 1.0)[0, 0], capped_logits(saturated, 1.0)[0, 1])
    assert int(head.greedy(saturated)) == 1
    multi = make_head(gym.spaces.MultiDiscrete([3, 2]), logit_cap=1.0)
    assert multi.greedy(torch.tensor([[300.0, 301.0, -5.0, 400.0, 399.0, 0.0]])).tolist() == [
        [1, 0]
    ]


def test_logit_cap_reaches_the_policy_from_the_config() -> None:
    """`GRPOConfig.logit_cap` builds a policy whose categorical head caps its logits."""
    space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    capped = build_policy(GRPOConfig(logit_cap=2.0), space, gym.spaces.Discrete(3))
    assert capped.head.logit_cap == 2.0
    assert build_policy(GRPOConfig(), space, gym.spaces.Discrete(3)).head.logit_cap is None


def test_discrete_start_is_added_for_the_env_only() -> None:
    """Discrete(3, start=-1): stored actions are indices 0..2, the env gets -1..1."""
    space = gym.spaces.Discrete(3, start=-1)
    head = make_head(space)
    stored = torch.tensor([0, 1, 2], dtype=head.action_dtype)
    env_action = head.to_env(stored)
    assert env_action.tolist() == [-1, 0, 1]
    assert all(space.contains(int(a)) for a in env_action)


def test_action_storage_dtype_is_the_smallest_that_fits() -> None:
    """Indices are stored as uint8 up to 256 choices, int32 beyond."""
    assert make_head(gym.spaces.Discrete(256)).action_dtype == torch.uint8
    head = make_head(gym.spaces.Discrete(300))
    assert head.action_dtype == torch.int32
    params = torch.zeros(1, 300)
    params[0, 299] = 50.0  # all the mass on the last index, which does not fit in a uint8
    action, _ = head.sample(params, head.noise(1, _gen(), torch.device("cpu")))
    assert action.to(head.action_dtype).item() == 299


# -- MultiDiscrete -----------------------------------------------------------------------------

NVEC = np.array([2, 5, 3])
START = np.array([0, 1, -1])


def _multi_head() -> MultiCategoricalHead:
    head = make_head(gym.spaces.MultiDiscrete(NVEC, start=START))
    assert isinstance(head, MultiCategoricalHead)
    return head


def _per_dim_dists(params: torch.Tensor) -> list[Categorical]:
    """The independent categoricals: dimension i uses the first nvec[i] logits of its block."""
    width = int(NVEC.max())
    blocks = params.unflatten(-1, (len(NVEC), width))
    return [Categorical(logits=blocks[:, i, :n]) for i, n in enumerate(NVEC)]


def test_multi_discrete_log_prob_and_entropy_match_torch() -> None:
    """logp and entropy are the sums over independent per-dimension categoricals."""
    head = _multi_head()
    assert head.param_dim == len(NVEC) * int(NVEC.max())
    g = _gen(3)
    params = torch.randn(BATCH, head.param_dim, generator=g) * 2
    action = torch.stack([torch.randint(0, int(n), (BATCH,), generator=g) for n in NVEC], -1)
    logp, entropy = head.log_prob_entropy(params, action.to(head.action_dtype))
    dists = _per_dim_dists(params)
    expected_logp = sum(d.log_prob(action[:, i]) for i, d in enumerate(dists))
    expected_entropy = sum(d.entropy() for d in dists)
    torch.testing.assert_close(logp, expected_logp)
    torch.testing.assert_close(entropy, expected_entropy)


def test_multi_discrete_never_samples_an_invalid_index() -> None:
    """With unequal nvec, padded slots are never chosen, whatever the noise; logp matches."""
    head = _multi_head()
    g = _gen(4)
    space = gym.spaces.MultiDiscrete(NVEC, start=START)
    # Uniform logits, so every valid index is likely; and adversarial noise that favours
    # exactly the padded slots (u -> 1 gives the largest Gumbel value).
    params = torch.zeros(BATCH, head.param_dim)
    noise = head.noise(BATCH, g, torch.device("cpu"))
    adversarial = torch.where(head.invalid, 1.0, 0.0).expand_as(noise)
    for u in (noise, adversarial):
        action, logp = head.sample(params, u)
        assert action.shape == (BATCH, len(NVEC))
        assert bool((action < torch.as_tensor(NVEC)).all())
        torch.testing.assert_close(logp, head.log_prob_entropy(params, action)[0])
        env_action = head.to_env(action).numpy()
        assert all(space.contains(a) for a in env_action)
    # Uniform logits and random noise over 256 draws reach every valid index of every dim.
    action, _ = head.sample(params, noise)
    for i, n in enumerate(NVEC):
        assert set(action[:, i].tolist()) == set(range(int(n)))


def test_multi_discrete_greedy_ignores_padding() -> None:
    """greedy picks the best valid index even when a padded slot has the largest raw logit."""
    head = _multi_head()
    params = torch.zeros(1, head.param_dim)
    blocks = params.view(1, len(NVEC), int(NVEC.max()))
    blocks[0, 0, 4] = 100.0  # padding of dimension 0 (nvec 2)
    blocks[0, 0, 1] = 1.0
    assert head.greedy(params)[0, 0].item() == 1


# -- Box ---------------------------------------------------------------------------------------

BOX = gym.spaces.Box(
    low=np.array([[-1.0, 0.0, -2.0], [-0.5, -3.0, 0.0]], dtype=np.float32),
    high=np.array([[1.0, 1.0, 2.0], [0.5, 3.0, 4.0]], dtype=np.float32),
)


def _gaussian_head() -> GaussianHead:
    head = make_head(BOX)
    assert isinstance(head, GaussianHead)
    with torch.no_grad():
        head.log_std.copy_(torch.linspace(-1.0, 0.5, head.param_dim))
    return head


def test_gaussian_log_prob_and_entropy_match_torch() -> None:
    """Diagonal Gaussian: logp and entropy equal Normal(mean, exp(log_std)) summed over dims."""
    head = _gaussian_head()
    g = _gen(5)
    params = torch.randn(BATCH, head.param_dim, generator=g)
    action = torch.randn(BATCH, *BOX.shape, generator=g) * 2
    logp, entropy = head.log_prob_entropy(params, action)
    dist = Normal(params, head.log_std.exp())
    torch.testing.assert_close(logp, dist.log_prob(action.flatten(1)).sum(-1))
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))


def test_gaussian_sample_logp_is_exact_and_env_gets_clipped_actions() -> None:
    """Samples are mean + std * noise, stored unclipped (exact logp); to_env clips to bounds."""
    head = _gaussian_head()
    g = _gen(6)
    params = torch.randn(BATCH, head.param_dim, generator=g)
    noise = head.noise(BATCH, g, torch.device("cpu")) * 3  # wide, so many fall outside bounds
    action, logp = head.sample(params, noise)
    assert action.shape == (BATCH, *BOX.shape)
    torch.testing.assert_close(
        action.flatten(1), params + head.log_std.exp() * noise, rtol=1e-6, atol=1e-6
    )
    torch.testing.assert_close(logp, head.log_prob_entropy(params, action)[0])
    low, high = torch.as_tensor(BOX.low), torch.as_tensor(BOX.high)
    outside = (action < low) | (action > high)
    assert bool(outside.any())  # the clipping below is exercised
    clipped = head.to_env(action)
    assert torch.equal(clipped, torch.clamp(action, low, high))
    assert all(BOX.contains(a) for a in clipped.detach().numpy())


def test_gaussian_greedy_is_the_mean() -> None:
    """greedy returns the mean, shaped like the action space."""
    head = _gaussian_head()
    params = torch.randn(4, head.param_dim, generator=_gen(7))
    assert torch.equal(head.greedy(params), params.unflatten(-1, BOX.shape))


def test_gaussian_bound_penalty_is_zero_inside_and_quadratic_outside() -> None:
    """relu(|mean - centre| / half_range - 1)^2, averaged over the bounded dims: 0 inside
    and on the bounds, 1/4 per dim at one half-range past a bound, 4 times that at two."""
    head = make_head(gym.spaces.Box(-2.0, 2.0, (2,), np.float32))  # centre 0, half-range 2
    assert head.bounded
    inside = torch.tensor([[0.0, 0.0], [1.9, -2.0], [2.0, 2.0], [-2.0, 0.5]])
    assert torch.equal(head.bound_penalty(inside), torch.zeros(4))
    past = torch.tensor([[4.0, 0.0], [6.0, 0.0], [0.0, -6.0], [6.0, -6.0]])
    # 2 past the bound: (4 / 2 - 1)^2 = 1 on one dim of 2 -> 0.5; 4 past: (6 / 2 - 1)^2 = 4.
    torch.testing.assert_close(head.bound_penalty(past), torch.tensor([0.5, 2.0, 2.0, 4.0]))
    # Off-centre bounds: BOX's dims, e.g. [0, 4] (centre 2, half-range 2) and [0, 1]; every
    # std below its dim's half-range (the narrowest is 0.5), so only the means count.
    box = _gaussian_head()
    with torch.no_grad():
        box.log_std.fill_(-1.0)
    params = torch.zeros(1, box.param_dim)
    params[0, 5] = 8.0  # dim [0, 4]: (|8 - 2| / 2 - 1)^2 = 4
    params[0, 1] = -0.5  # dim [0, 1]: (|-0.5 - 0.5| / 0.5 - 1)^2 = 1
    torch.testing.assert_close(box.bound_penalty(params), torch.tensor([5.0 / 6]))


def test_the_bound_penalty_pulls_a_std_wider_than_half_the_range_back() -> None:
    """A std up to half a dim's range adds nothing; past it the penalty adds
    (log_std - log half_range)^2 averaged over the bounded dims, for every row alike, and its
    gradient on that log_std is the excess (2 x / 2 dims); an unbounded dim's std is free."""
    low = np.array([-1.0, -1.0, -np.inf], np.float32)
    high = np.array([1.0, 1.0, np.inf], np.float32)
    head = make_head(gym.spaces.Box(low, high))
    params = torch.zeros(4, 3)
    with torch.no_grad():
        head.log_std.copy_(torch.tensor([0.0, -0.5, 9.0]))  # at, below, unbounded
    assert torch.equal(head.bound_penalty(params), torch.zeros(4))
    with torch.no_grad():
        head.log_std.copy_(torch.tensor([3.0, -0.5, 9.0]))
    penalty = head.bound_penalty(params)
    torch.testing.assert_close(penalty, torch.full((4,), 9.0 / 2))
    (grad,) = torch.autograd.grad(penalty[0], head.log_std)
    torch.testing.assert_close(grad, torch.tensor([3.0, 0.0, 0.0]))


def test_the_bound_penalty_skips_unbounded_dims_and_discrete_heads() -> None:
    """Dims without two finite bounds add nothing (nor average in); categoricals' is 0."""
    low = np.array([-1.0, -np.inf, 0.0, -np.inf], np.float32)
    high = np.array([1.0, np.inf, np.inf, 3.0], np.float32)
    head = make_head(gym.spaces.Box(low, high))
    assert head.bounded
    params = torch.tensor([[3.0, 1e6, -1e6, 1e6], [0.0, -1e6, 1e6, -1e6]])
    torch.testing.assert_close(head.bound_penalty(params), torch.tensor([4.0, 0.0]))
    free = make_head(gym.spaces.Box(-np.inf, np.inf, (3,), np.float32))
    assert not free.bounded
    assert torch.equal(free.bound_penalty(torch.full((2, 3), 1e6)), torch.zeros(2))
    for space in (gym.spaces.Discrete(3), gym.spaces.MultiDiscrete([2, 3])):
        discrete = make_head(space)
        assert not discrete.bounded
        params = torch.randn(4, discrete.param_dim)
        assert torch.equal(discrete.bound_penalty(params), torch.zeros(4))


def test_update_terms_hand_the_loss_a_penalty_only_where_a_head_has_bounds() -> None:
    """The update's forward returns the penalty for a bounded Box, and None where it is
    always 0 (an unbounded Box, a categorical), so the loss spends no ops on it."""
    obs_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    obs = torch.zeros(3, 4)
    spaces = [
        (gym.spaces.Box(-2.0, 2.0, (2,), np.float32), True),
        (gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), False),
        (gym.spaces.Discrete(3), False),
    ]
    for space, bounded in spaces:
        policy = Policy(obs_space, space, (8,))
        action = policy.act(obs, greedy=False, generator=_gen(0))
        _, _, penalty, _ = policy.update_terms(obs, action)
        assert (penalty is not None) is bounded, space
        if penalty is not None:
            assert penalty.shape == (3,)


def test_the_bound_penalty_gradient_pulls_the_mean_back_toward_the_bounds() -> None:
    """d penalty / d mean = 2 excess / half_range * sign(mean - centre) / bounded dims: a
    gradient step moves a mean past either bound back in; inside, the gradient is 0."""
    head = make_head(gym.spaces.Box(-2.0, 2.0, (2,), np.float32))
    params = torch.tensor([[6.0, 0.5], [-10.0, 1.0]], requires_grad=True)
    (grad,) = torch.autograd.grad(head.bound_penalty(params).sum(), params)
    # 6: excess 2, 2 * 2 / 2 / 2 dims = 1; -10: excess 4 -> -2; inside: 0.
    torch.testing.assert_close(grad, torch.tensor([[1.0, 0.0], [-2.0, 0.0]]))
    stepped = params.detach() - 0.5 * grad
    assert bool((stepped[:, 0].abs() < params.detach()[:, 0].abs()).all())


def test_update_terms_are_log_prob_entropy_and_the_bound_penalty_of_one_forward() -> None:
    torch.manual_seed(0)
    policy = Policy(gym.spaces.Box(-1.0, 1.0, (4,), np.float32), BOX, (8,), "tanh")
    obs = torch.randn(16, 4, generator=_gen(3))
    action = torch.randn(16, *BOX.shape, generator=_gen(4))
    logp, entropy, penalty, value = policy.update_terms(obs, action)
    assert value is None  # no critic
    expected = policy.log_prob_entropy(obs, action)
    assert torch.equal(logp, expected[0]) and torch.equal(entropy, expected[1])
    assert torch.equal(penalty, policy.head.bound_penalty(policy(obs)))


# -- Policy ------------------------------------------------------------------------------------


def _has_conv(module: nn.Module) -> bool:
    return any(isinstance(m, nn.Conv2d) for m in module.modules())


def test_cnn_for_pixel_observations_mlp_for_features() -> None:
    """FruitCatcher's uint8 (1, H, W) pixels get the CNN; its feature vector gets an MLP."""
    pixels = gym.make_vec("FruitCatcher-v0", num_envs=2, obs_mode="pixels")
    features = gym.make_vec("FruitCatcher-v0", num_envs=2)
    try:
        assert is_image_space(pixels.single_observation_space)
        assert not is_image_space(features.single_observation_space)
        cnn = Policy(pixels.single_observation_space, pixels.single_action_space, (16,))
        mlp = Policy(features.single_observation_space, features.single_action_space, (16,))
        assert _has_conv(cnn) and not _has_conv(mlp)
        obs, _ = pixels.reset(seed=0)
        assert obs.dtype == torch.uint8
        noise = cnn.head.noise(2, _gen(), torch.device("cpu"))
        action, logp = cnn.sample(obs, noise)
        assert action.shape == (2,)
        torch.testing.assert_close(logp, cnn.log_prob_entropy(obs, action)[0])
        # The CNN reads pixels scaled to [0, 1]: feeding floats / 255 gives the same output.
        torch.testing.assert_close(cnn(obs), cnn.body(obs.float() / 255.0))
    finally:
        pixels.close()
        features.close()


def test_policy_sample_and_log_prob_agree() -> None:
    """Policy.sample's logp equals Policy.log_prob_entropy of the sampled action."""
    obs_space = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
    torch.manual_seed(0)
    policy = Policy(obs_space, gym.spaces.Discrete(3), (8, 8), "relu")
    obs = torch.rand(32, 6, generator=_gen(8)) * 2 - 1
    action, logp = policy.sample(obs, policy.head.noise(32, _gen(9), torch.device("cpu")))
    torch.testing.assert_close(logp, policy.log_prob_entropy(obs, action)[0])
    assert policy.act(obs).shape == (32,)


@pytest.mark.parametrize(
    ("obs_space", "action_space", "match"),
    [
        (gym.spaces.Discrete(4), gym.spaces.Discrete(3), "observation space"),
        (
            gym.spaces.Dict({"a": gym.spaces.Box(0, 1, (2,))}),
            gym.spaces.Discrete(3),
            "observation space",
        ),
        (gym.spaces.Box(0, 1, (2,)), gym.spaces.Box(0, 5, (2,), dtype=np.int64), "action space"),
        (gym.spaces.Box(0, 1, (2,)), gym.spaces.MultiBinary(3), "action space"),
        (
            gym.spaces.Box(0, 1, (2,)),
            gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(2))),
            "action space",
        ),
    ],
)
def test_unsupported_spaces_raise_value_error(
    obs_space: gym.Space, action_space: gym.Space, match: str
) -> None:
    """Spaces the policy cannot handle are rejected with ValueError saying which one."""
    with pytest.raises(ValueError, match=f"unsupported {match}"):
        Policy(obs_space, action_space)


def test_initial_policy_is_near_uniform() -> None:
    """The output layer starts orthogonal with gain 0.01 and zero bias, so the first policy is
    close to uniform.

    Its rows have norm 0.01 and the 64 tanh features have norm at most 8, so every logit lies
    in [-0.08, 0.08]. Then log p_i - log(1/n) = z_i - (logsumexp(z) - log n) lies within
    [min z - max z, max z - min z], a subset of [-0.16, 0.16].
    """
    obs_space = gym.spaces.Box(0.0, 1.0, (10,), np.float32)
    torch.manual_seed(0)
    policy = Policy(obs_space, gym.spaces.Discrete(3))  # hidden (64, 64), tanh
    out = policy.body[-1]
    assert isinstance(out, nn.Linear) and out.in_features == 64
    torch.testing.assert_close(out.weight.norm(dim=1), torch.full((3,), 0.01))
    assert torch.count_nonzero(out.bias) == 0
    obs = torch.rand(64, 10, generator=_gen(10))
    logp_all = torch.log_softmax(policy(obs), -1)
    assert bool(((logp_all - math.log(1 / 3)).abs() <= 0.16).all())


@pytest.mark.parametrize(
    "space",
    [
        gym.spaces.Discrete(3, start=-1),
        gym.spaces.MultiDiscrete([2, 3]),
        gym.spaces.Box(-2.0, 2.0, (2,), np.float32),
    ],
)
def test_act_gives_env_actions_greedy_or_sampled(space: gym.Space) -> None:
    """`act` is SB3's `predict`: greedy actions are the head's most likely ones in the env's
    form; sampled ones repeat with a generator of the same seed and lie in the space."""
    torch.manual_seed(0)
    policy = Policy(gym.spaces.Box(-1.0, 1.0, (4,), np.float32), space, (8,), "tanh", (8,))
    obs = torch.randn(64, 4, generator=_gen(1))
    greedy = policy.act(obs)
    assert torch.equal(greedy, policy.head.to_env(policy.head.greedy(policy(obs))))
    sampled = policy.act(obs, greedy=False, generator=_gen(2))
    assert torch.equal(sampled, policy.act(obs, greedy=False, generator=_gen(2)))
    assert not sampled.requires_grad
    assert all(space.contains(np.asarray(a, dtype=space.dtype)) for a in sampled.numpy())


def test_correlated_exploration_noise_is_an_ar1_process_on_gaussian_heads_only() -> None:
    """noise_correlation rho: a sub-env's noise (innovation plus what is carried) starts from
    rest and becomes a standard normal per step with lag-1 correlation rho; each step samples
    with the innovation alone, sqrt(1 - rho^2) of it and independent of what is carried.
    Categorical noise stays independent draws (the same stream as without correlation)."""
    from grpo_trainer.algorithm.rollout import ExplorationNoise

    box = make_head(gym.spaces.Box(-1.0, 1.0, (2,), np.float32), 0.9)
    noise = ExplorationNoise(box, 4096)
    gen = torch.Generator().manual_seed(0)
    innovations, totals, carries = [], [], []
    for step in range(80):
        innovation, carried = noise.draw(gen, torch.device("cpu"))
        assert (carried is None) == (step == 0)  # from rest: nothing carried at first
        carried = torch.zeros_like(innovation) if carried is None else carried
        innovations.append(innovation)
        carries.append(carried)
        totals.append(innovation + carried)
    late = torch.stack(totals[40:])  # 1 - 0.81^40 of the stationary variance, within 1e-3
    assert late.std().item() == pytest.approx(1.0, abs=0.02)
    lag1 = (late[1:] * late[:-1]).mean() / late.var()
    assert lag1.item() == pytest.approx(0.9, abs=0.02)
    new, old = torch.stack(innovations[40:]), torch.stack(carries[40:])
    assert new.std().item() == pytest.approx(math.sqrt(1 - 0.81), abs=0.01)
    assert (new * old).mean().item() == pytest.approx(0.0, abs=0.01)
    assert torch.equal(noise.last, totals[-1])

    cat = make_head(gym.spaces.Discrete(3))
    a = ExplorationNoise(cat, 8)  # a categorical has no correlation to take
    gen_a, gen_b = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    for _ in range(3):
        fresh, carried = a.draw(gen_a, torch.device("cpu"))
        assert carried is None and torch.equal(fresh, cat.noise(8, gen_b, None))


def test_a_correlated_gaussian_scores_the_innovation_and_the_env_gets_the_carried_noise() -> None:
    """With rho, a sampled action is mean + std * innovation, its log-prob and the entropy
    are those of a Normal with std * sqrt(1 - rho^2) (exact for what the step drew), and
    `shift` adds std * carried noise for the env; rho = 0 is the plain Gaussian."""
    space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    rho = 0.95
    head = make_head(space, rho)
    with torch.no_grad():
        head.log_std.copy_(torch.tensor([-0.5, 0.3]))
    params = torch.randn(5, 2, generator=_gen(3))
    innovation = torch.randn(5, 2, generator=_gen(4)) * math.sqrt(1 - rho * rho)
    action, logp = head.sample(params, innovation)
    std = head.log_std.detach().exp()
    torch.testing.assert_close(action, params + std * innovation)
    dist = Normal(params, std * math.sqrt(1 - rho * rho))
    torch.testing.assert_close(logp, dist.log_prob(action).sum(-1))
    scored, entropy = head.log_prob_entropy(params, action)
    torch.testing.assert_close(scored, logp)
    torch.testing.assert_close(entropy, dist.entropy().sum(-1))
    carried = torch.randn(5, 2, generator=_gen(5))
    torch.testing.assert_close(head.shift(action, carried), action + std * carried)
    plain = make_head(space)
    with torch.no_grad():
        plain.log_std.copy_(head.log_std)
    _, plain_logp = plain.sample(params, innovation)
    torch.testing.assert_close(plain_logp, Normal(params, std).log_prob(action).sum(-1))


def test_the_cpu_tanh_agrees_with_torch_tanh_and_its_gradient() -> None:
    """`Tanh` (2 sigmoid(2x) - 1) stays within 2.4e-7 of `torch.tanh` over [-20, 20], inside
    [-1, 1], and back-propagates tanh's own gradient, 1 - y^2."""
    x = torch.linspace(-20.0, 20.0, 400_001, requires_grad=True)
    y = Tanh()(x)
    assert (y - torch.tanh(x)).abs().max().item() <= 2.4e-7
    assert y.min().item() >= -1.0 and y.max().item() <= 1.0
    (grad,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(grad, 1.0 - y.detach() ** 2, atol=1e-6, rtol=0.0)


def test_a_rollout_pass_in_slices_gives_the_whole_passs_values_and_log_probs() -> None:
    """The critic's values and the stored actions' log-probs of a whole rollout come out the
    same computed in slices (the CPU's `pass_rows`, here 7 rows, which divides no row count
    below) as in one pass, in the rollout's shape, in float32, with no grad."""
    space = gym.spaces.Box(0.0, 1.0, (5, 5, 2), np.float32)
    config = GRPOConfig(value_coef=0.5)
    policy = build_policy(config, space, gym.spaces.Discrete(3))
    calls = AutocastPolicy(policy, None, config, "off", torch.device("cpu"))
    assert calls.pass_rows == CPU_PASS_ROWS
    # off the CPU (a GPU; the meta device stands in for one here) a pass stays one pass
    assert AutocastPolicy(policy, None, config, "off", torch.device("meta")).pass_rows is None
    rows = (torch.rand(6, 5, 5, 5, 2, generator=_gen()) < 0.3).to(torch.float16)
    actions = torch.randint(0, 3, (30,), generator=_gen(1), dtype=torch.uint8)
    calls.pass_rows = None
    whole_values = calls.values(rows)
    whole_logp = calls.log_prob(rows.flatten(0, 1), actions)
    calls.pass_rows = 7
    sliced_values = calls.values(rows)
    sliced_logp = calls.log_prob(rows.flatten(0, 1), actions)
    assert sliced_values.shape == (6, 5) and sliced_logp.shape == (30,)
    assert sliced_values.dtype == sliced_logp.dtype == torch.float32
    assert not sliced_values.requires_grad and not sliced_logp.requires_grad
    torch.testing.assert_close(sliced_values, whole_values, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sliced_logp, whole_logp, rtol=1e-6, atol=1e-6)
    assert torch.unique(sliced_values).numel() > 20  # the rows differ: no constant passes

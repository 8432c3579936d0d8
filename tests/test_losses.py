"""The LK losses (arXiv 2602.23881, as speculators implements them): values, gradients against the closed form of
speculators' fused kernel, and one step of each token loss moving the draft toward the target."""

from __future__ import annotations

import pytest
import torch

from draftsmith.layers.losses import (
    NLA_EPS,
    TOKEN_LOSSES,
    acceptance,
    lk_hybrid,
    neg_log_acceptance,
    soft_cross_entropy,
    token_loss,
)


def toy(rows: int = 6, vocab: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Student logits (rows, vocab) and a peaked teacher distribution p (rows, vocab), in float64."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g, dtype=torch.float64)
    p = torch.softmax(3 * torch.randn(rows, vocab, generator=g, dtype=torch.float64), -1)
    return logits, p


def test_lk_losses_equal_their_hand_computed_values():
    p = torch.tensor([[0.5, 0.3, 0.2]])
    q = torch.tensor([[0.2, 0.2, 0.6]])
    logits = q.log()
    alpha = 0.2 + 0.2 + 0.2
    kl = sum(pv * torch.log(torch.tensor(pv / qv)) for pv, qv in zip([0.5, 0.3, 0.2], [0.2, 0.2, 0.6], strict=True))
    weight = torch.exp(torch.tensor(-3.0 * alpha))
    torch.testing.assert_close(acceptance(logits, p), torch.tensor([alpha]))
    torch.testing.assert_close(neg_log_acceptance(logits, p), -torch.log(torch.tensor([alpha])))
    torch.testing.assert_close(lk_hybrid(logits, p), (weight * kl + (1 - weight) * (1 - alpha)).reshape(1))
    # a draft that misses the target entirely costs -log(eps), not infinity
    miss = torch.tensor([[0.0, 0.0, 1.0]])
    assert neg_log_acceptance(torch.tensor([[30.0, 30.0, -30.0]]), miss).item() == pytest.approx(
        -torch.log(torch.tensor(NLA_EPS)).item()
    )


def test_lk_losses_gradients_equal_the_closed_form_of_speculators_fused_kernel():
    """Eager reference for the fused path speculators writes as a Triton kernel (``losses/fused.py``): with q the
    draft's softmax and s the draft mass where q <= p, d alpha / d logits = q (1[q <= p] - s); nla's gradient is
    -1/alpha times that, lk_hybrid's lambda (q - p) - (1 - lambda) times that (lambda held constant)."""
    logits, p = toy()
    q = torch.softmax(logits, -1)
    below = (q <= p).to(q.dtype)
    s = (q * below).sum(-1, keepdim=True)
    alpha = torch.minimum(q, p).sum(-1, keepdim=True)
    d_alpha = q * (below - s)
    weight = torch.exp(-3.0 * alpha)
    expected = {
        "alpha": d_alpha,
        "nla": -d_alpha / alpha,
        "lk_hybrid": weight * (q - p) - (1 - weight) * d_alpha,
        "kl": q - p,
    }
    functions = {
        "alpha": acceptance,
        "nla": neg_log_acceptance,
        "lk_hybrid": lk_hybrid,
        "kl": soft_cross_entropy,
    }
    for name, fn in functions.items():
        x = logits.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(fn(x, p).sum(), x)
        torch.testing.assert_close(grad.double(), expected[name], atol=1e-6, rtol=1e-5, msg=name)


@pytest.mark.parametrize("name", TOKEN_LOSSES)
def test_one_step_of_each_token_loss_raises_the_acceptance_probability(name):
    logits, p = toy(rows=16, vocab=64, seed=1)
    logits = logits.float().requires_grad_(True)
    p = p.float()
    opt = torch.optim.SGD([logits], lr=1.0)
    before = acceptance(logits, p).detach()
    token_loss(name, logits, p).sum().backward()  # rows are independent: each row's own gradient step
    opt.step()
    after = acceptance(logits, p).detach()
    assert after.mean() > before.mean() + 0.005  # sum_v min(p, q) up: total variation 1 - alpha down
    assert bool((after > before).all())


def test_unknown_token_loss_is_an_error():
    logits, p = toy()
    with pytest.raises(ValueError, match="unknown token loss 'tv'"):
        token_loss("tv", logits, p)

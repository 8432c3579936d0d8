"""Which target hidden states a feature drafter reads by default (EAGLE-1/-3, DFlash, TLT, the feature cache)."""

from __future__ import annotations

from draftsmith.errors import DraftsmithError


def default_feature_layers(num_layers: int, version: int) -> tuple[int, ...]:
    """The target layers (HF hidden_states indices) an EAGLE-``version`` drafter reads by default.

    EAGLE-1: the final hidden state. EAGLE-3 (and DFlash, which reads as EAGLE-3 does): low, middle, high layers.
    Targets of 8+ layers get EAGLE-3's (2, L/2, L-3). Shallower ones get the top three states that
    serving engines can capture, HF ``hidden_states[L-3..L-1]`` (clamped to 1). The final state
    ``hidden_states[L]`` is the *normed* one, which neither vLLM nor SGLang exposes to EAGLE-3, so a
    drafter trained on it could not be exported. It carries more next-token information on shallow
    targets (on the 4-layer default target (2, 3, 4) reached val/tau_est 2.57 where (1, 2, 3) reached
    2.17 after the same 180 steps); pass ``feature_layers`` to trade servability for that.
    """
    if version == 1:
        return (-1,)
    if version != 3:
        raise DraftsmithError(f"eagle version must be 1 or 3, got {version}")
    if num_layers >= 8:
        return (2, num_layers // 2, num_layers - 3)
    return tuple(max(1, num_layers - i) for i in (3, 2, 1))

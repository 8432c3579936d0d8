"""Speculative decoding: the verifier (``verifier.py``), its metrics (α, τ, per-position acceptance, τ's gain with
its interval: ``metrics.py``) and ``--k auto``'s cost model (``auto_k.py``). Below the families, above ``layers``:
it needs only ``core`` and ``layers``, so a family's own code may decode with it."""

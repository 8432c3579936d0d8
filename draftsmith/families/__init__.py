"""Drafter families, one subpackage each: ``network.py`` (config dataclass, network, the verifier's drafter),
``module.py`` (its LightningModule, named by the family's recipes). Networks register with
``registry.register``; importing this package imports every family, so the registry knows them all.

Adding a family: a new subpackage here (``__init__.py`` importing its network, ``network.py`` with a
``@register("name", config=...)`` ``DrafterNetwork``, ``module.py`` with a ``DrafterModule``), its line below,
and a recipe in ``configs/``. A family built on another (its network or drafter is the other's, changed) is a
subpackage of that family's folder: P-EAGLE, Falcon and TLT in ``eagle/``, DSpark in ``dflash/``; no family imports
another. A family an engine serves also has ``export.py``: its block for each export format, each
registered with ``@registry.exports("vllm", "name")`` (the format's contract is in ``export/<format>.py``).
"""

from draftsmith.families import registry  # noqa: I001  (the registry first: the families register into it)
from draftsmith.families import (  # noqa: F401
    acceptance_head,
    clover,
    dflash,
    draft_lm,
    eagle,
    hydra,
    kangaroo,
    medusa,
    ngram,
    online,
    pard,
    s2d,
)
from draftsmith.families.dflash import dspark  # noqa: F401  (an algorithm built on a family lives in its folder)
from draftsmith.families.eagle import falcon, peagle  # noqa: F401
from draftsmith.families.registry import build_network, load_network, load_trained, methods
from draftsmith.families.specs import load_drafter

__all__ = ["build_network", "load_drafter", "load_network", "load_trained", "methods", "registry"]

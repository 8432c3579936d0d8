"""RASD: retrieval drafts fused with any tree drafter's tree into one verification tree (``drafter.py``)."""

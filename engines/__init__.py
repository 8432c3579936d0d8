"""The real engines and the peers' own code, run from their own venvs to check draftsmith against them; used by
the tests and the benchmarks, not shipped in the package.

- ``vllm_check`` / ``vllm_serve.py``: a draftsmith export served by vLLM (``draftsmith/export/vllm_venv.sh``'s venv,
  which ``draftsmith generate --engine vllm`` also uses), its output and acceptance counters against the verifier's.
- ``peer_check`` / ``peer_forward.py`` / ``peer_venv.sh``: an export loaded by the peers' own model classes
  (vllm-project/speculators, SpecForge) in their venvs, and checkpoints their code writes, for the importers.
- ``peers/``: the peers' own trainers on draftsmith's packed corpus, each in its venv (``speculators_train.py``,
  ``specforge_train.py``; ``prepare*.py`` write the corpus's rows for them from draftsmith's venv), whose
  checkpoints ``draftsmith import`` brings in and ``benchmarks/peers.py`` scores beside draftsmith's (issue 86).
"""

"""Multi-stage runs built from the library: the quickstart, the draft-LM stages, SLURM jobs."""

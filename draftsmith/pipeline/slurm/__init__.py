"""SLURM batch jobs: render the ``templates/*.sbatch`` (shipped as package data), submit them, follow them.

``resources.py`` (what a job asks for, checked before anything is submitted), ``render.py`` (templates),
``sbatch.py`` (the SLURM commands), ``submit.py`` (``draftsmith slurm submit|pipeline``),
``status.py`` (``draftsmith slurm status``), ``requeue.py`` (the training callback that checkpoints and
requeues on SLURM's warning signal).
"""

"""Shared building blocks of the families: losses, the tree-drafting base, the teacher-forced acceptance estimate,
and the generic ``DrafterModule`` wiring every family's LightningModule extends."""

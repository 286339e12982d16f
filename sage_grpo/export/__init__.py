"""Exporting trained weights: :mod:`.weights` (reading any checkpoint form; the transformer and LoRA exports),
:mod:`.pipeline` (a whole diffusers pipeline folder, ``--format pipeline``)."""

"""The toy world's studies: pretraining the toy checkpoint (:mod:`.pretrain`, which samples through the pipeline) and
the ablation study (:mod:`.study`, which runs the trainer). They sit in the top layer, next to the entry points, so
that the toy world itself (:mod:`sage_grpo.toy`: rendering, manifold error, analytic velocities), which the rewards
score, needs nothing above it."""

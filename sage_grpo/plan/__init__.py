"""The memory planner, in layers: the run's sections it reads (``options``), model and activation sizes (``sizes``),
the reward models' and held-out scorers' share (``scorers``), each component's bytes on one GPU (``components``), the
phases of a step (``phases``, into a ``breakdown``), the launch's ``auto`` decisions and the placement
(``memory``, spending what is left on speed in ``throughput``), what fits and the launch check (``report``), whether
the weights alone fit (``fit``), and the step run on fake tensors (``simulate``: ``fake_launch``, ``tracking``,
``comparison``).

``python -m sage_grpo.plan --world_size 8 --gpu_memory_gb 80 <post_train.py flags>`` prints the plan.
"""

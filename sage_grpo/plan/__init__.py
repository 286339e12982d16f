"""The memory planner: model and activation sizes (``sizes``), the per-GPU bytes of each phase and the ``auto``
placement decisions (``memory``), and what fits plus the launch check (``report``).

``python -m sage_grpo.plan --world_size 8 --gpu_memory_gb 80 <post_train.py flags>`` prints the plan.
"""

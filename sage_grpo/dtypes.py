"""The one table from the precision names the flags take (``--dtype``, ``--master_weight_type``, the export's
``--dtype``) to torch dtypes."""

import torch

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}

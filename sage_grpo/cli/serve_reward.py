"""Serve a reward model over HTTP for ``post_train.py --remote_reward_url`` (wire format: sage_grpo/rewards/remote.py).

    sage-grpo serve-reward --pretrained_model_root ckpts --port 8765     # VideoAlign, bf16 (scripts/reward_server.py)
    python post_train.py --remote_reward_url http://127.0.0.1:8765 ...                    # the trainer, elsewhere

Every reward flag is the trainer's (``python scripts/reward_server.py --help``). The server prints one line with its
address once the model has loaded, then serves until interrupted. On a shared network require a token:

    python -c 'import secrets; print(secrets.token_hex(32))' > token && chmod 600 token
    sage-grpo serve-reward --host 0.0.0.0 --auth_token_file token ...
    SAGE_GRPO_REWARD_TOKEN=$(cat token) python post_train.py --remote_reward_url http://<server>:8765 ...
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before any hub library is imported: the server never downloads

from sage_grpo.config.reward_server import RewardServerConfig
from sage_grpo.config.schema import parse_cli


def main(argv=None) -> int:
    cfg = parse_cli(RewardServerConfig, argv, description=__doc__.splitlines()[0])
    from sage_grpo.rewards.serving import exposure_warning, make_server, service_from_config

    try:
        service = service_from_config(cfg)
        server = make_server(service, cfg.host, cfg.port)
    except (ValueError, ImportError, FileNotFoundError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    warning = exposure_warning(host, service)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    print(f"serving reward {service.reward_model!r} (metrics {service.metric_names}) on http://{host}:{port}",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


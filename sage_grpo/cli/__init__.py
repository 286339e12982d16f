"""Command-line entry points; each ``main(argv=None)`` returns the exit status (or exits through argparse).

Installed as console commands by ``pyproject.toml`` (``pip install -e .``); the scripts at the repository root
(``post_train.py``, ``generate.py``, ``scripts/export_checkpoint.py``, ``scripts/convert_reference_checkpoint.py``) are
thin wrappers around the same functions, so both forms take the same flags. ``sage-grpo <verb>`` (:mod:`.main`) runs
each of them and the commands that have no console command of their own (``sage-grpo --help`` lists the verbs):

    sage-grpo                       sage_grpo.cli.main:main         train, generate, evaluate, export, plan,
                                                                    serve-reward, convert, verify, make-tiny, plot
    sage-grpo-train                 sage_grpo.cli.train:main        (post_train.py)
    sage-grpo-generate              sage_grpo.cli.generate:main     (generate.py)
    sage-grpo-export                sage_grpo.cli.export:main       (scripts/export_checkpoint.py)
    sage-grpo-verify-weights        sage_grpo.cli.verify:main       (python -m sage_grpo.cli.verify)
    sage-grpo-convert-reference     sage_grpo.cli.convert:main      (scripts/convert_reference_checkpoint.py)
"""

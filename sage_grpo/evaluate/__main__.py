import sys

from sage_grpo.evaluate import main

sys.exit(main())

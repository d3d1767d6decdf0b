"""`python -m grpo_trainer train | eval | play | sweep`."""

import sys

from grpo_trainer.tools.cli import main

sys.exit(main())

"""`python -m grpo_trainer train | eval | play | sweep`."""

import sys

from grpo_trainer.cli import main

sys.exit(main())

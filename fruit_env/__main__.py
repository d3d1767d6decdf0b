"""`python -m fruit_env play|demo`: see `fruit_env.cli`."""

from fruit_env.cli import main

raise SystemExit(main())

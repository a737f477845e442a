"""``python -m dpsharp``: the same command as the ``dpsharp`` console script."""

from dpsharp.cli import main

raise SystemExit(main())

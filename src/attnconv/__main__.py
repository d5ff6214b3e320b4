"""``python -m attnconv`` (also what ``torchrun -m attnconv`` launches)."""

from attnconv.cli import main

raise SystemExit(main())

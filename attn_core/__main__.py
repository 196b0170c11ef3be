"""`python -m attn_core VERB ...`: see attn_core.cli (and --help)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())

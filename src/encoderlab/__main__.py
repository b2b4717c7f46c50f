"""`python -m encoderlab` runs the CLI (also what torchrun launches)."""

import sys

from encoderlab.cli import main

sys.exit(main())

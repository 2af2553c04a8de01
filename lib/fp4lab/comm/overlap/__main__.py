"""``python -m fp4lab.comm.overlap``: one rank of the overlap benchmark (run it under torchrun)."""

import sys

from fp4lab.comm.overlap.measure import main

sys.exit(main())

"""``python -m fp4lab.comm.allreduce``: one rank of the allreduce benchmark (run it under torchrun)."""

import sys

from fp4lab.comm.allreduce.measure import main

sys.exit(main())

"""``python -m fp4lab.compile.matrix run --versions 0.6.3,0.7.4``: build or reuse, trace, print."""

import sys

from fp4lab.compile.matrix.study import main

sys.exit(main())

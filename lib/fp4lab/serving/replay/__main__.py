import sys

from fp4lab.serving.replay.study import main

sys.exit(main())

import sys

import fp4lab

fp4lab.setup()  # every cache (uv's, FlashInfer's, tvm-ffi's, inductor's) in build/, as in a notebook

from fp4lab.serving.replay import check, study  # noqa: E402

argv = sys.argv[1:]
sys.exit(check.main(argv[1:]) if argv[:1] == ["check"] else study.main(argv))

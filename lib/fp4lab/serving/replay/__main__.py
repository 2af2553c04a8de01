import sys

from fp4lab.serving.replay import check, study

argv = sys.argv[1:]
sys.exit(check.main(argv[1:]) if argv[:1] == ["check"] else study.main(argv))

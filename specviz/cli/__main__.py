"""`python -m specviz.cli`: the command line, as the `specviz` command runs it."""
import sys

from specviz.cli.main import main

sys.exit(main())

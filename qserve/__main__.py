import sys

from qserve.cli import main

sys.exit(main())

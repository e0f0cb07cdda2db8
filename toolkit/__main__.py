import sys

from dstk.cli import main

sys.exit(main())

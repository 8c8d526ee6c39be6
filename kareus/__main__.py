import sys

from kareus.cli import main

sys.exit(main())

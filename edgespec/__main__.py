import sys

from edgespec.cli.main import main

sys.exit(main())

import sys

from edgespec.cli.main import entry

sys.exit(entry())

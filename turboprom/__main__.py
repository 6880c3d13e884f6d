import sys

from turboprom.cli import main

sys.exit(main())

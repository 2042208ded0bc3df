import sys

from pgq_thin.cli import main

sys.exit(main())

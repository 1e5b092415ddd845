"""``python -m nbrpc.lab solve|grade ...``: see ``nbrpc.lab.teacher.main``."""

import sys

from .teacher import main

if __name__ == "__main__":
    sys.exit(main())

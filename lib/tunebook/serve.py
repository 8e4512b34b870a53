"""`python -m tunebook.serve`: the command users type; the code lives in `tunebook.deploy.serve`."""

import sys

from tunebook.deploy.serve import main

if __name__ == "__main__":
    sys.exit(main())

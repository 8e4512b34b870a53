"""`python -m tunebook.chat`: the command users type; the code lives in `tunebook.deploy.chat`."""

import sys

from tunebook.deploy.chat import main

if __name__ == "__main__":
    sys.exit(main())

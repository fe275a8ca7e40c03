"""``python -m peermesh``: the same as the ``peermesh`` command."""

import sys

from .cli.commands import main

if __name__ == "__main__":
    sys.exit(main())

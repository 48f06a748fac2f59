"""``python -m jax_blink {plan,bench,calibrate} ...`` (see :mod:`jax_blink.cli`)."""

import sys

from jax_blink.cli import main

if __name__ == "__main__":
    sys.exit(main())

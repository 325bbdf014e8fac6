"""``python -m hiertail_fast.data convert SOURCE OUT``: see hiertail_fast/data/conversion.py."""
import sys

from hiertail_fast.data.conversion import main

if __name__ == "__main__":
    sys.exit(main())

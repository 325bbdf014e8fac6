"""``python -m hiertail_fast`` = ``python -m hiertail_fast.train`` (see its ``--help``)."""
from hiertail_fast.train import main

if __name__ == "__main__":
    main()

"""What the client-compatibility scripts share: one check, printed, and exit 1
on the first failure (the Rust test reads the output)."""

import sys


def check(cond, what):
    if not cond:
        print(f"FAILED: {what}")
        sys.exit(1)
    print(f"ok: {what}")

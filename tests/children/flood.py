"""Write ERR_MIB MiB to stderr and OUT_MIB MiB to stdout, interleaved, then an end marker on each.

Usage: flood.py ERR_MIB OUT_MIB. Block i is the line b"%07d\n" % i repeated to 1 MiB.
"""

import sys

MIB = 1 << 20
err_mib, out_mib = int(sys.argv[1]), int(sys.argv[2])
every = max(1, err_mib // max(1, out_mib))
out = err = 0
for i in range(max(err_mib, out_mib)):
    if err < err_mib:
        sys.stderr.buffer.write(b"%07d\n" % i * (MIB // 8))
        err += 1
    if out < out_mib and i % every == 0:
        sys.stdout.buffer.write(b"%07d\n" % i * (MIB // 8))
        out += 1
sys.stderr.buffer.write(b"stderr-end\n")
sys.stdout.buffer.write(b"stdout-end\n")

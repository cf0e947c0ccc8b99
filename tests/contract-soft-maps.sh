#!/bin/sh
# The soft provider's contract again, checking mappings the way kernels before 5.14 need
# (/proc/self/maps instead of MADV_POPULATE_*).
exec env MRD_SOFT_MAPS=1 "$MRD_BUILDDIR/tests/test-contract-soft"

#!/bin/sh
# The key-safety cases again on a soft provider that hands a released key out again unchanged,
# LIFO per size, as mlx5's mkey cache does ($MRD_SOFT_KEYS=mlx5): mrd's key quarantine must
# keep a freed allocation's rkey dead (unit: test-mr-cache; integration: test-libmrd-lookup).
set -e
export MRD_SOFT_KEYS=mlx5 CK_RUN_CASE=keys
"$MRD_BUILDDIR/tests/test-mr-cache"
"$MRD_BUILDDIR/tests/test-libmrd-lookup"

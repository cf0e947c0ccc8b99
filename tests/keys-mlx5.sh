#!/bin/sh
# The key-safety cases again on a soft provider that hands a released key out again unchanged,
# LIFO per size, as mlx5's mkey cache does ($MRD_SOFT_KEYS=mlx5): mrd's key quarantine must
# keep a freed allocation's rkey dead (unit: test-mr-cache; integration: test-libmrd-lookup),
# on-demand memory's too (test-mr-cache's keys case frees and reallocates both kinds): there a
# move makes the MR anew, its key back to its size's list, as mlx5 does, so mrd parks on-demand
# MRs in place, by a PD change.
# Each with every way a device moves an MR ($MRD_SOFT_REREG): as soft does (move), keeping its
# keys (keep-keys: mlx5's UMR), or not at all (refuse: rxe, siw). Where keys come back and
# moves are refused nothing can park, the guarantee does not hold, and the quarantine's case
# checks that mrctl pools counts every such MR in unparked. The provider contract runs as a
# device that refuses moves and as one whose moves keep keys.
set -e
for rereg in refuse keep-keys; do # the provider contract as a device that moves so
	echo "# MRD_SOFT_REREG=$rereg: the provider contract"
	MRD_SOFT_REREG=$rereg "$MRD_BUILDDIR/tests/test-contract-soft"
done
for rereg in move keep-keys refuse; do
	export MRD_SOFT_REREG=$rereg
	for keys in mlx5 variant; do
		export MRD_SOFT_KEYS=$keys
		echo "# MRD_SOFT_KEYS=$keys MRD_SOFT_REREG=$rereg"
		for case in quarantine quarantine-window-only; do
			CK_RUN_CASE=$case "$MRD_BUILDDIR/tests/test-mr-cache"
		done
		[ "$keys/$rereg" = mlx5/refuse ] && continue
		export CK_RUN_CASE=keys
		"$MRD_BUILDDIR/tests/test-mr-cache"
		"$MRD_BUILDDIR/tests/test-libmrd-lookup"
	done
done

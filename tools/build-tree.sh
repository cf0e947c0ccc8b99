#!/bin/sh
# Sourced by build.sh and check-sanitizers.sh (with $top set): enter_build_tree DIR makes
# $top/DIR if missing and cds into it. The tests run mrctl and clients as uid 1000 from the
# build tree (as root; otherwise those tests do not run), so a checkout under a folder other
# users cannot enter (root's home is 0700 on Debian) gets its tree in /var/tmp, DIR a link.

reachable() { # folder: whether uid 1000 can enter it
	[ "$(id -u)" -ne 0 ] && return 0
	setpriv --reuid=1000 --regid=1000 --clear-groups test -x "$1" 2> /dev/null
}

enter_build_tree() { # dir
	if [ ! -e "$top/$1" ] && ! reachable "$top"; then
		tree=$(mktemp -d "/var/tmp/mrd-$1.XXXXXX") && chmod 755 "$tree" &&
			ln -s "$tree" "$top/$1" || return 1
		echo "== $top: other users cannot enter it, and the tests run programs as uid 1000:" \
			"building in $tree ($1 links to it)"
	fi
	mkdir -p "$top/$1" && cd -P "$top/$1"
}

/* SPDX-License-Identifier: MIT */
/* Strings that clients chose (mempool names, process names) and that mrctl prints for root or
 * mrd puts on the bus: written so that they cannot move the cursor, talk to the terminal, forge
 * a line or a field, or make JSON invalid. */
#pragma once

#include <stddef.h>
#include <stdio.h>

enum {
	ESCAPE_SPACE = 1u << 0, /* a table cell: a space would forge a column */
};

/* Room for any string of n bytes escaped, with its NUL. */
#define ESCAPE_SIZE(n) (4 * (n) + 1)

/* s (NULL: "") escaped C-style into buf: \\, \", \n, \t, \r; other control bytes, DEL and
 * bytes that are not UTF-8 as \xHH; code points that reorder or hide text (C1 controls,
 * bidirectional and zero-width marks, line separators) as \uXXXX; printable ASCII and other
 * UTF-8 as they are. What does not fit in size ends in "..." (an escape is never cut). Returns
 * buf. */
const char *text_escape(const char *s, unsigned flags, char *buf, size_t size);

/* s (NULL: "") as a JSON string, quoted: control bytes, DEL and the code points above as \u
 * escapes, bytes that are not UTF-8 as \ufffd, so the output is valid UTF-8 JSON whatever s
 * holds. */
void json_write_string(FILE *f, const char *s);

/* s (NULL: "") as a label value of the OpenMetrics and Prometheus text formats, quoted: \\,
 * \" and \n, their only escapes; every other code point that does not show as itself (the
 * controls and marks above) and each byte that is not UTF-8 as U+FFFD, so a scraper parses
 * the line whatever s holds. */
void label_write_string(FILE *f, const char *s);

/* SPDX-License-Identifier: MIT */
/* The one JSON string writer of mrctl's --json output and mrd's D-Bus Dump. */
#pragma once

#include <stdio.h>

/* s quoted as a JSON string (NULL as ""): mrd's strings are printable already, but quote
 * defensively. */
static inline void json_write_string(FILE *f, const char *s)
{
	fputc('"', f);
	for (; s && *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s);
		else if ((unsigned char)*s < 0x20)
			fprintf(f, "\\u%04x", (unsigned)(unsigned char)*s);
		else
			fputc(*s, f);
	}
	fputc('"', f);
}

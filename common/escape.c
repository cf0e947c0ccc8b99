/* SPDX-License-Identifier: MIT */
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "escape.h"

/* The code point of the UTF-8 sequence at s, its length to *len; -1 (and *len 1) when s does
 * not start one: overlong forms, surrogates and values above U+10FFFF are not UTF-8. */
static int32_t utf8_decode(const unsigned char *s, size_t *len)
{
	unsigned n;
	int32_t c;

	*len = 1;
	if (s[0] < 0x80)
		return s[0];
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		n = 1, c = s[0] & 0x1f;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		n = 2, c = s[0] & 0x0f;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		n = 3, c = s[0] & 0x07;
	else
		return -1;
	for (unsigned i = 1; i <= n; i++) {
		if ((s[i] & 0xc0) != 0x80) /* the NUL at the end stops here too */
			return -1;
		c = (c << 6) | (s[i] & 0x3f);
	}
	if ((n == 2 && c < 0x800) || (n == 3 && (c < 0x10000 || c > 0x10ffff)) ||
	    (c >= 0xd800 && c <= 0xdfff))
		return -1;
	*len = n + 1;
	return c;
}

/* A code point a terminal shows as what it is: not a control, and none of the marks that
 * reorder or hide text (bidirectional overrides turn "exe.txt" into "txt.exe") or end a line. */
static bool shows_as_itself(int32_t c)
{
	return c >= 0x20 && c != 0x7f && !(c >= 0x80 && c < 0xa0) && c != 0xad && c != 0x61c &&
	       !(c >= 0x200b && c <= 0x200f) && !(c >= 0x2028 && c <= 0x202e) &&
	       !(c >= 0x2060 && c <= 0x206f) && c != 0xfeff && !(c >= 0xfff9 && c <= 0xfffb) &&
	       !(c >= 0xe0000 && c <= 0xe007f);
}

const char *text_escape(const char *s, unsigned flags, char *buf, size_t size)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "");
	size_t n = 0;

	if (size == 0)
		return buf;
	while (*p) {
		char e[16];
		size_t len, k;
		int32_t c = utf8_decode(p, &len);

		if (c == '\\' || c == '"')
			k = (size_t)snprintf(e, sizeof(e), "\\%c", (char)c);
		else if (c == '\n' || c == '\t' || c == '\r')
			k = (size_t)snprintf(e, sizeof(e), "\\%c", c == '\n' ? 'n' : c == '\t' ? 't' : 'r');
		else if (c == ' ' && (flags & ESCAPE_SPACE))
			k = (size_t)snprintf(e, sizeof(e), "\\x20");
		else if (c < 0 || (c < 0x80 && !shows_as_itself(c)))
			k = (size_t)snprintf(e, sizeof(e), "\\x%02x", (unsigned)*p);
		else if (!shows_as_itself(c))
			k = (size_t)snprintf(e, sizeof(e), c > 0xffff ? "\\U%08x" : "\\u%04x",
					     (unsigned)c);
		else
			memcpy(e, p, len), k = len;
		/* Room for it and, unless it is the last, for "..." after it. */
		if (n + k + (p[len] ? 3 : 0) >= size) {
			if (n + 3 < size)
				memcpy(buf + n, "...", 3), n += 3;
			break;
		}
		memcpy(buf + n, e, k);
		n += k;
		p += len;
	}
	buf[n] = '\0';
	return buf;
}

void json_write_string(FILE *f, const char *s)
{
	const unsigned char *p = (const unsigned char *)(s ? s : "");

	fputc('"', f);
	while (*p) {
		size_t len;
		int32_t c = utf8_decode(p, &len);

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", (char)c);
		else if (c == '\n')
			fputs("\\n", f);
		else if (c == '\t')
			fputs("\\t", f);
		else if (c < 0)
			fputs("\\ufffd", f);
		else if (c > 0xffff && !shows_as_itself(c)) /* a surrogate pair */
			fprintf(f, "\\u%04x\\u%04x", (unsigned)(0xd800 + ((c - 0x10000) >> 10)),
				(unsigned)(0xdc00 + ((c - 0x10000) & 0x3ff)));
		else if (!shows_as_itself(c))
			fprintf(f, "\\u%04x", (unsigned)c);
		else
			fwrite(p, 1, len, f);
		p += len;
	}
	fputc('"', f);
}

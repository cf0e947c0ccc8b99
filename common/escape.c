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

/* The escape of the character at p into e (16 bytes), its length returned; the character's
 * length to *len. */
static size_t escape_one(const unsigned char *p, unsigned flags, char *e, size_t *len)
{
	int32_t c = utf8_decode(p, len);

	if (c == '\\' || c == '"')
		return (size_t)snprintf(e, 16, "\\%c", (char)c);
	if (c == '\n' || c == '\t' || c == '\r')
		return (size_t)snprintf(e, 16, "\\%c", c == '\n' ? 'n' : c == '\t' ? 't' : 'r');
	if (c == ' ' && (flags & ESCAPE_SPACE))
		return (size_t)snprintf(e, 16, "\\x20");
	if (c < 0 || (c < 0x80 && !shows_as_itself(c)))
		return (size_t)snprintf(e, 16, "\\x%02x", (unsigned)*p);
	if (!shows_as_itself(c))
		return (size_t)snprintf(e, 16, c > 0xffff ? "\\U%08x" : "\\u%04x", (unsigned)c);
	memcpy(e, p, *len);
	return *len;
}

const char *text_escape(const char *s, unsigned flags, char *buf, size_t size)
{
	const unsigned char *start = (const unsigned char *)(s ? s : "");
	size_t n = 0, whole = 0, reserve;
	char e[16];

	if (size == 0)
		return buf;
	for (const unsigned char *p = start; *p;) { /* whether it all fits */
		size_t len;

		whole += escape_one(p, flags, e, &len);
		p += len;
	}
	reserve = whole < size ? 0 : 3; /* room for "..." when it does not */
	for (const unsigned char *p = start; *p;) {
		size_t len, k = escape_one(p, flags, e, &len);

		if (n + k + reserve >= size)
			break;
		memcpy(buf + n, e, k);
		n += k;
		p += len;
	}
	if (reserve && n + 3 < size)
		memcpy(buf + n, "...", 3), n += 3;
	buf[n] = '\0';
	return buf;
}

/* s (NULL: "") in quotes: \\, \" and \n escaped, every other character through put (c: its code
 * point, -1 for a byte that is not UTF-8; p and len: its bytes). */
static void write_quoted(FILE *f, const char *s,
			 void (*put)(FILE *f, int32_t c, const unsigned char *p, size_t len))
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
		else
			put(f, c, p, len);
		p += len;
	}
	fputc('"', f);
}

static void json_put(FILE *f, int32_t c, const unsigned char *p, size_t len)
{
	if (c == '\t')
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
}

void json_write_string(FILE *f, const char *s)
{
	write_quoted(f, s, json_put);
}

/* The text formats have no other escape. */
static void label_put(FILE *f, int32_t c, const unsigned char *p, size_t len)
{
	if (c < 0 || !shows_as_itself(c))
		fputs("\xef\xbf\xbd", f); /* U+FFFD */
	else
		fwrite(p, 1, len, f);
}

void label_write_string(FILE *f, const char *s)
{
	write_quoted(f, s, label_put);
}

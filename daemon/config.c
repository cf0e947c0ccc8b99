/* SPDX-License-Identifier: MIT */
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config.h"
#include "macro.h"
#include "wire.h"

void config_init(struct config *c)
{
	*c = (struct config){
		.log_level = LOG_LEVEL_INFO,
		.max_clients = 1024,
		.max_inflight = 64,
		.max_frame = WIRE_FRAME_DEFAULT,
		.max_fds = 4,
		.max_protocol_errors = 16,
	};
}

void config_done(struct config *c)
{
	free(c->socket_path);
	free(c->provider);
	free(c->device);
	free(c->admin_group);
	config_init(c);
}

static int set_string(char **field, const char *value)
{
	char *s = NULL;

	if (*value) {
		s = strdup(value);
		if (!s)
			return -ENOMEM;
	}
	free(*field);
	*field = s;
	return 0;
}

static int set_unsigned(unsigned *field, const char *value, unsigned min, unsigned max)
{
	unsigned long v;
	char *end;

	if (!isdigit((unsigned char)*value))
		return -EINVAL;
	errno = 0;
	v = strtoul(value, &end, 10);
	if (errno || *end)
		return -EINVAL;
	if (v < min || v > max)
		return -ERANGE;
	*field = (unsigned)v;
	return 0;
}

int config_set(struct config *c, const char *section, const char *key, const char *value)
{
	int r;

	if (strcmp(section, "mrd") == 0) {
		if (strcmp(key, "socket") == 0)
			return *value == '/' ? set_string(&c->socket_path, value) : -EINVAL;
		if (strcmp(key, "provider") == 0) {
			if (strcmp(value, "auto") && strcmp(value, "soft") && strcmp(value, "verbs"))
				return -EINVAL;
			return set_string(&c->provider, value);
		}
		if (strcmp(key, "device") == 0)
			return set_string(&c->device, value);
		if (strcmp(key, "admin_group") == 0)
			return set_string(&c->admin_group, value);
		if (strcmp(key, "log_level") == 0) {
			r = log_level_from_string(value);
			if (r < 0)
				return r;
			c->log_level = r;
			return 0;
		}
	} else if (strcmp(section, "limits") == 0) {
		if (strcmp(key, "clients") == 0)
			return set_unsigned(&c->max_clients, value, 1, 1u << 20);
		if (strcmp(key, "requests_in_flight") == 0)
			return set_unsigned(&c->max_inflight, value, 1, 4096);
		if (strcmp(key, "frame_bytes") == 0)
			return set_unsigned(&c->max_frame, value, 512, WIRE_FRAME_MAX);
		if (strcmp(key, "fds_per_message") == 0)
			return set_unsigned(&c->max_fds, value, 0, WIRE_FDS_MAX);
		if (strcmp(key, "protocol_errors") == 0)
			return set_unsigned(&c->max_protocol_errors, value, 0, 1u << 20);
	}
	return -ENOENT;
}

static char *strip(char *s)
{
	char *e;

	while (isspace((unsigned char)*s))
		s++;
	e = s + strlen(s);
	while (e > s && isspace((unsigned char)e[-1]))
		*--e = '\0';
	return s;
}

int config_load_file(struct config *c, const char *path)
{
	_cleanup_free_ char *line = NULL;
	char section[64] = "";
	size_t cap = 0;
	unsigned lineno = 0;
	struct stat st;
	FILE *f;
	int r = 0;

	f = fopen(path, "re");
	if (!f)
		return negative_errno();
	if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode)) {
		fclose(f);
		return log_error_errno(-EINVAL, "%s: not a regular file", path);
	}

	while (getline(&line, &cap, f) >= 0) {
		char *s = strip(line), *eq;

		lineno++;
		if (*s == '\0' || *s == '#' || *s == ';')
			continue;
		if (*s == '[') {
			char *end = strchr(s, ']');
			if (!end || end[1] != '\0' || (size_t)(end - s - 1) >= sizeof(section)) {
				r = log_error_errno(-EINVAL, "%s:%u: bad section header", path, lineno);
				break;
			}
			*end = '\0';
			snprintf(section, sizeof(section), "%s", s + 1);
			continue;
		}
		eq = strchr(s, '=');
		if (!eq) {
			r = log_error_errno(-EINVAL, "%s:%u: expected key = value", path, lineno);
			break;
		}
		*eq = '\0';
		r = config_set(c, section, strip(s), strip(eq + 1));
		if (r == -ENOENT) {
			r = log_error_errno(-EINVAL, "%s:%u: unknown key '%s' in section [%s]", path,
					    lineno, strip(s), section);
			break;
		}
		if (r < 0) {
			r = log_error_errno(r, "%s:%u: bad value for '%s': %m", path, lineno, strip(s));
			break;
		}
	}
	if (r == 0 && ferror(f))
		r = log_error_errno(-EIO, "%s: read error", path);
	fclose(f);
	return r;
}

int config_finish(struct config *c)
{
	if (!c->socket_path && set_string(&c->socket_path, MRD_SOCKET_DEFAULT) < 0)
		return -ENOMEM;
	if (!c->provider && set_string(&c->provider, "auto") < 0)
		return -ENOMEM;
	if (c->admin_group) {
		struct group *g;
		char *end;
		unsigned long gid;

		errno = 0;
		gid = strtoul(c->admin_group, &end, 10);
		if (*end == '\0' && !errno && gid < UINT_MAX)
			c->admin_gid = (gid_t)gid;
		else if ((g = getgrnam(c->admin_group)))
			c->admin_gid = g->gr_gid;
		else
			return log_error_errno(-ENOENT, "admin_group '%s': no such group",
					       c->admin_group);
	}
	return 0;
}

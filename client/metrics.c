/* SPDX-License-Identifier: MIT */
#include <stdio.h>
#include <string.h>

#include "escape.h"
#include "metrics.h"

void metrics_init(struct metrics *m, FILE *f, enum metrics_format format)
{
	*m = (struct metrics){ .f = f, .format = format };
}

void metrics_family(struct metrics *m, const char *name, enum metric_type type, const char *unit,
		    const char *help)
{
	static const char *const suffixes[] = { [METRIC_GAUGE] = "", [METRIC_COUNTER] = "_total",
						[METRIC_INFO] = "_info" };
	static const char *const om_types[] = { [METRIC_GAUGE] = "gauge",
						[METRIC_COUNTER] = "counter", [METRIC_INFO] = "info" };
	/* Prometheus 0.0.4 names the family as its samples and has no info type. */
	static const char *const prom_types[] = { [METRIC_GAUGE] = "gauge",
						  [METRIC_COUNTER] = "counter",
						  [METRIC_INFO] = "gauge" };

	m->type = type;
	m->labels = 0;
	snprintf(m->sample, sizeof(m->sample), "%s%s", name, suffixes[type]);
	if (m->format == METRICS_OPENMETRICS) {
		fprintf(m->f, "# TYPE %s %s\n", name, om_types[type]);
		if (unit)
			fprintf(m->f, "# UNIT %s %s\n", name, unit);
		fprintf(m->f, "# HELP %s %s\n", name, help);
		return;
	}
	fprintf(m->f, "# HELP %s %s\n# TYPE %s %s\n", m->sample, help, m->sample, prom_types[type]);
}

void metrics_label(struct metrics *m, const char *name, const char *value)
{
	fprintf(m->f, "%s%s%s=", m->labels ? "" : m->sample, m->labels ? "," : "{", name);
	label_write_string(m->f, value);
	m->labels++;
}

/* The sample's name, or the end of its labels. */
static void sample_start(struct metrics *m)
{
	fputs(m->labels ? "}" : m->sample, m->f);
	m->labels = 0;
}

void metrics_value(struct metrics *m, uint64_t value)
{
	sample_start(m);
	fprintf(m->f, " %llu\n", (unsigned long long)value);
}

void metrics_value_double(struct metrics *m, double value)
{
	sample_start(m);
	fprintf(m->f, " %.6f\n", value);
}

void metrics_end(struct metrics *m)
{
	if (m->format == METRICS_OPENMETRICS)
		fputs("# EOF\n", m->f);
}

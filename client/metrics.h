/* SPDX-License-Identifier: MIT */
/* Metric families in the OpenMetrics text format (1.0.0) or Prometheus's text format (0.0.4),
 * from one description: the formats differ in how a counter and an info metric are named,
 * UNIT lines and the "# EOF" that ends OpenMetrics. A family's samples follow its metadata,
 * each family once (both formats require it). */
#pragma once

#include <stdint.h>
#include <stdio.h>

enum metrics_format {
	METRICS_OPENMETRICS,
	METRICS_PROMETHEUS,
};

enum metric_type {
	METRIC_GAUGE,
	METRIC_COUNTER, /* samples NAME_total */
	METRIC_INFO,    /* samples NAME_info, value 1: its labels are the information */
};

struct metrics {
	FILE *f;
	enum metrics_format format;
	enum metric_type type;
	char sample[128]; /* the sample name of the family being written */
	unsigned labels;  /* of the sample being written */
};

void metrics_init(struct metrics *m, FILE *f, enum metrics_format format);

/* A family named name (without _total or _info; ending in _unit where unit is not NULL). help:
 * a constant sentence, no backslash, quote or newline. */
void metrics_family(struct metrics *m, const char *name, enum metric_type type, const char *unit,
		    const char *help);

/* A label of the next sample; value escaped (label_write_string). */
void metrics_label(struct metrics *m, const char *name, const char *value);

/* The sample, with the labels given since the last one. */
void metrics_value(struct metrics *m, uint64_t value);
void metrics_value_double(struct metrics *m, double value);

/* The end: "# EOF" in OpenMetrics. */
void metrics_end(struct metrics *m);

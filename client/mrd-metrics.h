/* SPDX-License-Identifier: MIT */
/* mrd's figures as metric families (mrctl stats --openmetrics/--prometheus): the daemon's
 * from Status, each domain's from Clients, each handle pool's from FrmrPools. */
#pragma once

#include "metrics.h"
#include "wire.h"

void mrd_metrics_write(struct metrics *m, const Mrd__StatusResponse *status,
		       const Mrd__ClientsResponse *clients, const Mrd__FrmrPoolsResponse *pools);

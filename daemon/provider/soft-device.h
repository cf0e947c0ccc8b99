/* SPDX-License-Identifier: MIT */
/* The soft provider's device, which all its contexts in the process share, as contexts share a
 * NIC: whether it is there, and whether its port is up. A test drives it through
 * $MRD_SOFT_EVENTS=<fifo> (read at open), one byte an event: 'F' the device fails (every op of
 * every context fails with -EIO, and an open with -ENODEV, until 'R': it is back), 'D' / 'U'
 * its port goes down / up, 'G' the device is removed as rxe is (failed, but no event says so:
 * mrd finds it gone), 'Q' an event of a QP that is not mrd's (a client's that imported
 * the context), whose pointer mrd must neither read nor acknowledge. */
#pragma once

#include <stdbool.h>

#include "provider/provider.h"

/* At a context's open: the FIFO opened on first use. -EINVAL (logged) when the variable names
 * no FIFO. */
int soft_device_open(void);
void soft_device_close(void);
/* The FIFO (O_NONBLOCK), -1 without $MRD_SOFT_EVENTS. */
int soft_device_fd(void);
/* One event read from the FIFO ('R' comes back as PROVIDER_EVENT_OTHER), -EAGAIN when none. */
int soft_device_read_event(struct provider_event *ret);
/* Whether the device failed and is not back; bytes pending in the FIFO are read first, so a
 * device that came back while no context watched is seen back. */
bool soft_device_failed(void);
/* Failed by 'G'. */
bool soft_device_removed(void);
bool soft_device_port_active(void);

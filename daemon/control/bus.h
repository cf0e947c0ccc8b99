/* SPDX-License-Identifier: MIT */
/* mrd on the system bus (sd-bus, driven by mrd's libevent loop): the name org.mrd.Mrd1 and
 * the object /org/mrd/Mrd1 with the interface org.mrd.Mrd1 — read-only properties for anyone,
 * Dump, Flush and SetPoolSettings for root (the policy in dbus/org.mrd.Mrd1.conf, and sd-bus's
 * own privilege check). The socket stays mrd's main interface: without a bus mrd warns and
 * serves on. */
#pragma once

struct manager;
struct bus;

#define BUS_NAME "org.mrd.Mrd1"
#define BUS_PATH "/org/mrd/Mrd1"
#define BUS_INTERFACE "org.mrd.Mrd1"

/* Connects to the system bus ($DBUS_SYSTEM_BUS_ADDRESS when set) and takes the name. 0 with
 * *ret NULL when there is no bus or the name is taken (said in a warning), -errno when mrd
 * itself fails (memory). */
int bus_new(struct manager *m, struct bus **ret);
/* NULL-safe; returns NULL. */
struct bus *bus_free(struct bus *b);

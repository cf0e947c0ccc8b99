/* SPDX-License-Identifier: MIT */
/* verbs: rdma-core. With verbs-loopback.c, the only daemon file that includes
 * <infiniband/verbs.h>; it converts libibverbs' error conventions (NULL + errno, positive errno
 * returns, rereg's own codes) to -errno here, once. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/queue.h>
#include <sys/stat.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "log.h"
#include "macro.h"
#include "provider/provider.h"
#include "provider/verbs-loopback.h"

struct verbs_pd;
struct verbs_mr;
struct verbs_mw;

/* A lost context kept open for the MRs whose dereg failed when it was lost (verbs_lose): the
 * kernel still holds them, pinned, and their later dereg goes through this context (closing
 * it would free what libibverbs' ibv_dereg_mr reads, mr->context). Closed with the last. */
struct verbs_kept {
	LIST_ENTRY(verbs_kept) link;
	struct ibv_context *ctx;
	unsigned mrs;
};

struct verbs_provider {
	struct provider base;
	struct ibv_context *ctx; /* NULL once lost (verbs_lose) */
	struct provider_stats stats;
	void *parking; /* one page that parked MRs point at (verbs_park) */
	struct ibv_pd *parking_pd; /* no QP's: MRs parked in place (verbs_park_in_place) */
	/* Everything made on the context: lose and revive go through them, and an event's
	 * element is mrd's only when it is one of these PDs' loopback QPs or CQs. */
	LIST_HEAD(, verbs_pd) pds;
	LIST_HEAD(, verbs_mr) mrs;
	LIST_HEAD(, verbs_mw) mws;
	LIST_HEAD(, verbs_kept) kept;
	char dev_path[256]; /* the device's uverbs sysfs node: gone once its removal began */
	/* advise runs without the provider's lock: lose waits for it (write) */
	pthread_rwlock_t live;
};

struct verbs_pd {
	struct provider_pd base;
	LIST_ENTRY(verbs_pd) link;
	struct ibv_pd *pd; /* NULL while lost */
	/* The Dma request's QPs, made on first use, windows bound on them. Their own locks: a
	 * transfer waits for the device, and must not hold up every other op as the provider's
	 * lock would, nor a grant or revoke on mrd's loop (win_lock: transfers and window ops run
	 * at once, verbs-loopback.h). The loopback is made, mended and freed under both, dma_lock
	 * first; read under either. */
	pthread_mutex_t dma_lock;
	pthread_mutex_t win_lock;
	struct verbs_loopback *loopback;
};

struct verbs_mr {
	struct provider_mr base;
	LIST_ENTRY(verbs_mr) link;
	bool lost;       /* let go with its device (verbs_lose): registered again on revive */
	struct ibv_mr *mr;
	/* Its registration on a lost context whose dereg failed (verbs_lose): it lives on in
	 * kept->ctx until a dereg succeeds, beside mr, the one revive made on the new context. */
	struct ibv_mr *kept_mr;
	struct verbs_kept *kept;
	uint64_t pinned; /* bytes the kernel pinned for it (0 for ODP) */
	unsigned ibv_access; /* what the device MR grants now: nothing while parked */
	bool parked;     /* on the parking page (verbs_park) */
};

/* A type-2 window: allocated on the PD, bound through its loopback (verbs-loopback.h). */
struct verbs_mw {
	struct provider_mw base;
	LIST_ENTRY(verbs_mw) link;
	struct ibv_mw *mw;                 /* NULL while lost (verbs_lose) */
	struct verbs_loopback_pair *pair;  /* bound on; NULL: not bound on the device */
};

static struct verbs_provider *to_verbs(struct provider *p) { return (struct verbs_provider *)p; }

/* A positive errno return value (ibv_dereg_mr, ibv_advise_mr, ...) as -errno. */
static int verbs_ret(int ret) { return ret > 0 ? -ret : ret < 0 ? ret : 0; }

static unsigned to_ibv_access(unsigned access)
{
	unsigned a = 0;

	if (access & MRD_ACCESS_LOCAL_WRITE)
		a |= IBV_ACCESS_LOCAL_WRITE;
	if (access & MRD_ACCESS_REMOTE_WRITE)
		a |= IBV_ACCESS_REMOTE_WRITE;
	if (access & MRD_ACCESS_REMOTE_READ)
		a |= IBV_ACCESS_REMOTE_READ;
	if (access & MRD_ACCESS_REMOTE_ATOMIC)
		a |= IBV_ACCESS_REMOTE_ATOMIC;
	if (access & MRD_ACCESS_ON_DEMAND)
		a |= IBV_ACCESS_ON_DEMAND;
	if (access & MRD_ACCESS_MW_BIND)
		a |= IBV_ACCESS_MW_BIND;
	return a;
}

static uint64_t page_span(uint64_t addr, uint64_t length)
{
	uint64_t ps = (uint64_t)sysconf(_SC_PAGESIZE);

	return ((addr + length + ps - 1) & ~(ps - 1)) - (addr & ~(ps - 1));
}

/* Probes one size: an MR of length bytes at buf moved to buf + length, as a pool moves a
 * handle. 0 when the move gave new lkey and rkey; else what failed, in why. */
static int probe_move(struct ibv_pd *pd, uint8_t *buf, size_t length, const char *name,
		      char *why, size_t size)
{
	struct ibv_mr *mr;
	uint32_t lkey, rkey;
	int r;

	mr = ibv_reg_mr(pd, buf, length, IBV_ACCESS_LOCAL_WRITE);
	if (!mr) {
		r = negative_errno();
		snprintf(why, size, "no MR to probe with: %s (%s)", strerror(-r), name);
		return r;
	}
	lkey = mr->lkey, rkey = mr->rkey;
	/* Access 0: it does not change (verbs_rereg's comment). */
	errno = 0;
	r = ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, buf + length, length, 0);
	if (r != 0 && r != IBV_REREG_MR_ERR_DO_FORK_OLD) {
		r = negative_errno();
		snprintf(why, size, "rereg: %s (%s)", strerror(-r), name);
	} else if (mr->lkey == lkey || mr->rkey == rkey) {
		r = -EEXIST;
		snprintf(why, size, "a move keeps its keys (in-place update: mlx5's UMR, irdma) (%s)",
			 name);
	} else
		r = 0;
	(void)ibv_dereg_mr(mr); /* after ERR_CMD it may be gone already: nothing to lose */
	return r;
}

/* There is no capability bit for it: move an MR to new memory as the pools would, at one page
 * and at 2 MiB (mlx5 moves in place, keys kept, whenever the new pages fit the mkey's cache
 * entry, hw/mlx5/mr.c can_use_umr_rereg_pas; a size apart may take another path). Pools need
 * both sizes to give new lkey and rkey. rdma-core's rxe, siw, efa and bnxt_re providers have
 * no rereg_mr: libibverbs' stand-in fails it with EOPNOTSUPP (libibverbs/dummy_ops.c), and so
 * would the kernels (Linux 6.12: rxe_rereg_user_mr, sw/rxe/rxe_verbs.c, takes PD | ACCESS
 * only; siw has no rereg_user_mr, which uverbs' method needs, core/uverbs_cmd.c
 * UAPI_DEF_METHOD_NEEDS_FN). Only hns, irdma, mlx4 and mlx5 pass it on. mlx5 updates the
 * mkey in place by UMR (mlx5_ib_rereg_user_mr -> umr_rereg_pas, keys kept) or makes a new one
 * (create_real_mr: new keys, the old mkey back to its cache); irdma re-registers under the same
 * stag (hw/irdma/verbs.c, irdma_rereg_mr_trans). The answer goes to caps.rereg_probe and the
 * log ("verbs: <device>: rereg probe: ..."). */
static void probe_rereg(struct ibv_context *ctx, struct provider_caps *caps)
{
	const size_t sizes[] = { (size_t)sysconf(_SC_PAGESIZE), 2u << 20 };
	const char *names[] = { "1 page", "2 MiB" };
	char *why = caps->rereg_probe;
	const size_t size = sizeof(caps->rereg_probe);
	struct ibv_pd *pd;
	int r = 0;

	caps->rereg_translation = caps->rereg_new_keys = false;
	pd = ibv_alloc_pd(ctx);
	if (!pd) {
		snprintf(why, size, "no PD to probe with: %s", strerror(errno));
		return;
	}
	for (size_t i = 0; i < ELEMENTSOF(sizes) && r == 0; i++) {
		uint8_t *buf = mmap(NULL, 2 * sizes[i], PROT_READ | PROT_WRITE,
				    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (buf == MAP_FAILED) {
			r = negative_errno();
			snprintf(why, size, "no memory to probe with: %s", strerror(-r));
			break;
		}
		r = probe_move(pd, buf, sizes[i], names[i], why, size);
		munmap(buf, 2 * sizes[i]);
		if (r == 0 || r == -EEXIST)
			caps->rereg_translation = true;
	}
	(void)ibv_dealloc_pd(pd);
	caps->rereg_new_keys = r == 0;
	if (r == 0)
		snprintf(why, size, "a move gives new lkey and rkey (1 page and 2 MiB)");
	else if (r != -EEXIST)
		caps->rereg_translation = false; /* one size refused: pools cannot count on it */
}

/* A context on the device named device (NULL: the first), its name and uverbs node in vp; its
 * async fd made non-blocking, as mrd reads it on the loop. */
/* The probe's answer logged last for each device. The device is opened for every domain that
 * opens (libmrd-preload.so's programs each open one, binding their PDs) and for the served
 * devices' scan; the answer is news once per device, and again only when it changes (the
 * device lost and back, a firmware update). */
static struct {
	char device[sizeof(((struct provider_caps *)0)->device)];
	char answer[sizeof(((struct provider_caps *)0)->rereg_probe)];
} probes_logged[32];
static pthread_mutex_t probes_lock = PTHREAD_MUTEX_INITIALIZER;

static void log_probe(const struct provider_caps *caps)
{
	bool news = true;
	size_t i;

	pthread_mutex_lock(&probes_lock);
	for (i = 0; i < ELEMENTSOF(probes_logged) && probes_logged[i].device[0]; i++)
		if (strcmp(probes_logged[i].device, caps->device) == 0)
			break;
	if (i < ELEMENTSOF(probes_logged)) { /* past as many devices: each answer is logged */
		news = strcmp(probes_logged[i].answer, caps->rereg_probe) != 0 ||
		       !probes_logged[i].device[0];
		memcpy(probes_logged[i].device, caps->device, sizeof(probes_logged[i].device));
		memcpy(probes_logged[i].answer, caps->rereg_probe, sizeof(probes_logged[i].answer));
	}
	pthread_mutex_unlock(&probes_lock);
	log_full(news ? LOG_LEVEL_INFO : LOG_LEVEL_DEBUG, "verbs: %s: rereg probe: %s",
		 caps->device, caps->rereg_probe);
}

static int open_context(struct verbs_provider *vp, const char *device)
{
	struct ibv_device **list, *dev = NULL;
	int n = 0, r, flags;

	list = ibv_get_device_list(&n);
	if (!list)
		/* ENOSYS: no RDMA support in this kernel at all, which is "no device" to us. */
		return errno == ENOSYS ? -ENODEV : negative_errno();
	for (int i = 0; i < n && !dev; i++)
		if (!device || strcmp(ibv_get_device_name(list[i]), device) == 0)
			dev = list[i];
	if (!dev) {
		ibv_free_device_list(list);
		return -ENODEV;
	}
	snprintf(vp->base.caps.device, sizeof(vp->base.caps.device), "%s", ibv_get_device_name(dev));
	vp->base.caps.no_dma = verbs_loopback_unsupported(dev->node_type, dev->transport_type);
	snprintf(vp->dev_path, sizeof(vp->dev_path), "%s", dev->dev_path);
	vp->ctx = ibv_open_device(dev);
	r = vp->ctx ? 0 : negative_errno();
	ibv_free_device_list(list);
	if (r < 0)
		return r;
	flags = fcntl(vp->ctx->async_fd, F_GETFL);
	if (flags < 0 || fcntl(vp->ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0) {
		r = negative_errno();
		(void)ibv_close_device(vp->ctx);
		vp->ctx = NULL;
	}
	return r;
}

/* Whether a port of the device is active. */
static bool port_active(struct ibv_context *ctx)
{
	struct ibv_device_attr dev;

	if (ibv_query_device(ctx, &dev) != 0)
		return false;
	for (unsigned port = 1; port <= dev.phys_port_cnt; port++) {
		struct ibv_port_attr pa;

		if (ibv_query_port(ctx, (uint8_t)port, &pa) == 0 && pa.state == IBV_PORT_ACTIVE)
			return true;
	}
	return false;
}

/* vp's locks and lists, before any context is opened (tests start fakes from here too). */
static void verbs_provider_init(struct verbs_provider *vp)
{
	vp->base.ops = &provider_verbs_ops;
	pthread_mutex_init(&vp->base.lock, NULL);
	pthread_mutex_init(&vp->base.event_lock, NULL);
	pthread_rwlock_init(&vp->live, NULL);
	LIST_INIT(&vp->pds);
	LIST_INIT(&vp->mrs);
	LIST_INIT(&vp->mws);
	LIST_INIT(&vp->kept);
}

size_t provider_verbs_devices(char (*names)[64], size_t max)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	size_t n = 0;

	for (; list && list[n]; n++)
		if (n < max)
			snprintf(names[n], sizeof(names[n]), "%s", ibv_get_device_name(list[n]));
	if (list)
		ibv_free_device_list(list);
	return n;
}

/* ib_core's netns_mode is the variable "rdma system set netns" switches: Y shared, N exclusive. */
static bool netns_exclusive(void)
{
	FILE *f = fopen("/sys/module/ib_core/parameters/netns_mode", "re");
	int mode;

	if (!f)
		return false;
	mode = fgetc(f);
	fclose(f);
	return mode == 'N';
}

size_t provider_verbs_hidden(void)
{
	size_t uverbs = 0, listed;
	struct dirent *e;
	DIR *d;

	if (!netns_exclusive())
		return 0;
	/* The uverbs class is the one the kernel never splits by network namespace. */
	d = opendir("/sys/class/infiniband_verbs");
	if (!d)
		return 0;
	while ((e = readdir(d)))
		uverbs += strncmp(e->d_name, "uverbs", 6) == 0;
	closedir(d);
	listed = provider_verbs_devices(NULL, 0);
	return uverbs > listed ? uverbs - listed : 0;
}

/* Type-2 windows, where the device has them (rxe: type 2B, Linux rxe_param.h
 * RXE_DEVICE_CAP_FLAGS; siw: none, max_mw 0) and mrd can bind them: a type-2 bind is a work
 * request, posted on the PD's loopback QP, so a device that cannot loop back (caps.no_dma)
 * has none for mrd either. */
static void window_caps(const struct ibv_device_attr *attr, struct provider_caps *caps)
{
	bool type2 = attr->device_cap_flags &
		     (IBV_DEVICE_MEM_WINDOW_TYPE_2A | IBV_DEVICE_MEM_WINDOW_TYPE_2B);

	caps->mw = false;
	caps->mw_fresh_binds = 256; /* the key byte alone changes: ibv_inc_rkey */
	caps->max_mw = attr->max_mw > 0 ? (uint32_t)attr->max_mw : 0;
	caps->mw_wide = NULL;
	if (!type2 || attr->max_mw <= 0)
		caps->no_mw = "the device has no type-2 memory windows (device_cap_flags has no "
			      "MEM_WINDOW_TYPE_2A/2B, or max_mw is 0: siw has none)";
	else if (caps->no_dma)
		caps->no_mw = "windows are bound by a work request on mrd's loopback QPs, which "
			      "this device cannot connect (see DMA)";
	else {
		caps->mw = true;
		caps->no_mw = NULL;
	}
	/* rxe (vendor 0xffffff, rxe_param.h RXE_VENDOR_ID) checks a window's range against its
	 * MR's: rxe_resp.c check_rkey, mr_check_range(mr, ...) after rxe_lookup_mw. */
	if (caps->mw && attr->vendor_id == 0xffffff)
		caps->mw_wide = "rxe checks a window's range against its MR's (rxe_resp.c "
				"check_rkey): a window's rkey reaches the whole MR";
}

static int verbs_open(const char *device, struct provider **ret)
{
	struct ibv_device_attr_ex attr = {};
	struct verbs_provider *vp;
	int r;

	vp = calloc(1, sizeof(*vp));
	if (!vp)
		return -ENOMEM;
	verbs_provider_init(vp);
	r = open_context(vp, device);
	if (r < 0) {
		pthread_rwlock_destroy(&vp->live);
		pthread_mutex_destroy(&vp->base.lock);
		pthread_mutex_destroy(&vp->base.event_lock);
		free(vp);
		return r;
	}

	r = verbs_ret(ibv_query_device_ex(vp->ctx, NULL, &attr));
	if (r < 0) {
		ibv_close_device(vp->ctx);
		pthread_rwlock_destroy(&vp->live);
		pthread_mutex_destroy(&vp->base.lock);
		pthread_mutex_destroy(&vp->base.event_lock);
		free(vp);
		return r;
	}
	vp->base.caps.port_active = port_active(vp->ctx);
	vp->base.caps.max_mr_size = attr.orig_attr.max_mr_size;
	vp->base.caps.page_size = (uint32_t)sysconf(_SC_PAGESIZE);
	vp->base.caps.odp = attr.odp_caps.general_caps & IBV_ODP_SUPPORT;
	vp->base.caps.odp_implicit = attr.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT;
	vp->base.caps.odp_rc_caps = attr.odp_caps.per_transport_caps.rc_odp_caps;
	/* EFA's kernel driver zeroes atomic_cap (efa_query_device) and refuses REMOTE_ATOMIC
	 * in every reg_mr (efa_alloc_mr: EOPNOTSUPP); siw has none either. */
	vp->base.caps.atomic = attr.orig_attr.atomic_cap != IBV_ATOMIC_NONE;
	/* ibv_sge.length is 32-bit: pieces of 2 GiB, whole pages of any size up to it. */
	vp->base.caps.advise_max = 1ull << 31;
	probe_rereg(vp->ctx, &vp->base.caps);
	vp->base.caps.export_pd = true;
	vp->base.caps.keys_come_back = true; /* mlx5's mkey cache does; no device says it won't */
	vp->base.caps.odp_move_recreates = true; /* mlx5 does (hw/mlx5/mr.c); none says it won't */
	vp->base.caps.dma = !vp->base.caps.no_dma;
	window_caps(&attr.orig_attr, &vp->base.caps);
	if (vp->base.caps.no_dma)
		log_info("verbs: %s: no DMA through keys: %s", vp->base.caps.device,
			 vp->base.caps.no_dma);
	vp->parking = mmap(NULL, (size_t)vp->base.caps.page_size, PROT_READ | PROT_WRITE,
			   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (vp->parking == MAP_FAILED)
		vp->parking = NULL; /* no parking: verbs_park refuses, and pools stay off */
	log_debug("verbs: %s: max MR %llu, ODP %s%s", vp->base.caps.device,
		  (unsigned long long)vp->base.caps.max_mr_size, vp->base.caps.odp ? "yes" : "no",
		  vp->base.caps.odp_implicit ? " (implicit)" : "");
	log_probe(&vp->base.caps);
	*ret = &vp->base;
	return 0;
}

static void verbs_close(struct provider *p)
{
	struct verbs_provider *vp = to_verbs(p);
	struct verbs_kept *k;
	struct verbs_mw *vmw;

	while ((vmw = LIST_FIRST(&vp->mws))) { /* left behind: the context takes them along */
		LIST_REMOVE(vmw, link);
		free(vmw);
	}
	if (vp->parking_pd) /* the MRs parked on it went with their pools' quarantine */
		(void)ibv_dealloc_pd(vp->parking_pd);
	if (vp->ctx)
		(void)ibv_close_device(vp->ctx);
	while ((k = LIST_FIRST(&vp->kept))) {
		LIST_REMOVE(k, link);
		(void)ibv_close_device(k->ctx);
		free(k);
	}
	if (vp->parking)
		munmap(vp->parking, vp->base.caps.page_size);
	pthread_rwlock_destroy(&vp->live);
	pthread_mutex_destroy(&vp->base.lock);
	pthread_mutex_destroy(&vp->base.event_lock);
	free(vp);
}

static int verbs_pd_alloc(struct provider *p, struct provider_pd **ret)
{
	struct verbs_pd *vpd;

	if (!to_verbs(p)->ctx)
		return -ENODEV;
	vpd = calloc(1, sizeof(*vpd));
	if (!vpd)
		return -ENOMEM;
	vpd->pd = ibv_alloc_pd(to_verbs(p)->ctx);
	if (!vpd->pd) {
		int r = negative_errno();
		free(vpd);
		return r;
	}
	pthread_mutex_init(&vpd->dma_lock, NULL);
	pthread_mutex_init(&vpd->win_lock, NULL);
	vpd->base.provider = p;
	pthread_mutex_lock(&p->event_lock); /* owns_element walks the PDs */
	LIST_INSERT_HEAD(&to_verbs(p)->pds, vpd, link);
	pthread_mutex_unlock(&p->event_lock);
	*ret = &vpd->base;
	return 0;
}

/* The loopback's QPs and CQs are the event elements owns_element knows: made and destroyed
 * under event_lock, so that no event of them is read in between, and left unacknowledged (a
 * destroy waits for the acknowledgement of each event the kernel reported, rdma-core
 * libibverbs/cmd_qp.c ibv_cmd_destroy_qp). Both are a few device commands, not long. */
static int loopback_set(struct verbs_pd *vpd, struct ibv_pd *pd)
{
	pthread_mutex_t *l = &vpd->base.provider->event_lock;
	int r = 0;

	pthread_mutex_lock(l);
	verbs_loopback_free(vpd->loopback);
	vpd->loopback = NULL;
	if (pd)
		r = verbs_loopback_new(pd, &vpd->loopback);
	if (r == 0 && vpd->loopback)
		verbs_loopback_set_elements_lock(vpd->loopback, l);
	pthread_mutex_unlock(l);
	return r;
}

static int verbs_pd_free(struct provider_pd *base)
{
	struct verbs_pd *vpd = (struct verbs_pd *)base;
	int r;

	if (base->n_mrs > 0)
		return -EBUSY;
	loopback_set(vpd, NULL); /* its QPs hold the PD */
	r = vpd->pd ? verbs_ret(ibv_dealloc_pd(vpd->pd)) : 0; /* NULL: lost with its device */
	if (r < 0)
		return r;
	pthread_mutex_lock(&base->provider->event_lock);
	LIST_REMOVE(vpd, link);
	pthread_mutex_unlock(&base->provider->event_lock);
	pthread_mutex_destroy(&vpd->dma_lock);
	pthread_mutex_destroy(&vpd->win_lock);
	free(vpd);
	return 0;
}

static void mr_sync(struct verbs_mr *vmr, uint64_t iova)
{
	vmr->base.addr = (uint64_t)(uintptr_t)vmr->mr->addr;
	vmr->base.length = vmr->mr->length;
	vmr->base.iova = iova;
	vmr->base.lkey = vmr->mr->lkey;
	vmr->base.rkey = vmr->mr->rkey;
}

static int verbs_reg(struct provider_pd *pd, void *addr, size_t length, uint64_t iova,
		     unsigned access, struct provider_mr **ret)
{
	struct verbs_provider *vp = to_verbs(pd->provider);
	struct verbs_mr *vmr;
	int r;

	if (!vp->ctx)
		return -ENODEV;
	if ((access & MRD_ACCESS_ON_DEMAND) && !vp->base.caps.odp)
		return -EOPNOTSUPP;

	vmr = calloc(1, sizeof(*vmr));
	if (!vmr)
		return -ENOMEM;
	vmr->mr = ibv_reg_mr_iova2(((struct verbs_pd *)pd)->pd, addr, length, iova,
				   to_ibv_access(access));
	if (!vmr->mr) {
		r = negative_errno();
		free(vmr);
		return r;
	}
	vmr->base.pd = pd;
	vmr->base.access = access;
	vmr->ibv_access = to_ibv_access(access);
	mr_sync(vmr, iova);
	vmr->pinned = access & MRD_ACCESS_ON_DEMAND ? 0 : page_span((uintptr_t)addr, length);
	LIST_INSERT_HEAD(&vp->mrs, vmr, link);
	pd->n_mrs++;
	vp->stats.mrs++;
	vp->stats.registrations++;
	vp->stats.pinned_bytes += vmr->pinned;
	*ret = &vmr->base;
	return 0;
}

static int verbs_dereg(struct provider_mr *base)
{
	struct verbs_mr *vmr = (struct verbs_mr *)base;
	struct verbs_provider *vp = to_verbs(base->pd->provider);
	int r;

	if (vmr->mr) { /* NULL: lost in a failed rereg, or with its device */
		r = verbs_ret(ibv_dereg_mr(vmr->mr));
		if (r < 0)
			return r;
		vmr->mr = NULL;
		base->lkey = base->rkey = 0;
	}
	if (vmr->kept_mr) { /* refused again: only the old registration is left to dereg */
		r = verbs_ret(ibv_dereg_mr(vmr->kept_mr));
		if (r < 0)
			return r;
		vmr->kept_mr = NULL;
	}
	LIST_REMOVE(vmr, link);
	base->pd->n_mrs--;
	if (vmr->kept && --vmr->kept->mrs == 0) {
		(void)ibv_close_device(vmr->kept->ctx);
		LIST_REMOVE(vmr->kept, link);
		free(vmr->kept);
	}
	if (vmr->lost && !vmr->kept)
		; /* counted nowhere since its device went */
	else if (vmr->parked)
		vp->stats.parked--;
	else
		vp->stats.mrs--;
	vp->stats.pinned_bytes -= vmr->pinned;
	free(vmr);
	return 0;
}

/* One ibv_rereg_mr: to [addr, addr + length) unless addr is NULL, granting ibv_access.
 * libibverbs refuses a non-zero access without IBV_REREG_MR_CHANGE_ACCESS before the driver
 * runs (rdma-core libibverbs/verbs.c, ibv_rereg_mr: `if (access && !(flags &
 * IBV_REREG_MR_CHANGE_ACCESS))` -> IBV_REREG_MR_ERR_INPUT, EINVAL), so the access goes, with
 * the flag, only when it changes; 0 otherwise. -ESTALE: the MR is gone (verbs_rereg). */
static int mr_rereg(struct verbs_provider *vp, struct verbs_mr *vmr, void *addr, size_t length,
		    unsigned ibv_access)
{
	int flags = 0, r;

	if (vmr->lost)
		return -ENODEV;

	if (addr)
		flags |= IBV_REREG_MR_CHANGE_TRANSLATION;
	if (ibv_access != vmr->ibv_access)
		flags |= IBV_REREG_MR_CHANGE_ACCESS;
	if (!vmr->mr)
		return -ESTALE;
	if (!flags)
		return 0;
	errno = 0;
	r = ibv_rereg_mr(vmr->mr, flags, NULL, addr, length,
			 flags & IBV_REREG_MR_CHANGE_ACCESS ? (int)ibv_access : 0);
	/* DO_FORK_OLD comes after the device moved the MR: only the old range stays DONTFORK,
	 * which costs a child process those pages, nothing more. The move holds. */
	if (r == IBV_REREG_MR_ERR_DO_FORK_OLD)
		log_debug("verbs: rereg moved the MR but left its old range DONTFORK");
	else if (r != 0) {
		int error = negative_errno();

		/* IBV_REREG_MR_ERR_CMD and worse: the kernel may have destroyed the old MR on the
		 * way (mlx5 revokes it before making a new one). Free what is left; only dereg
		 * remains valid on this handle. */
		if (r <= IBV_REREG_MR_ERR_CMD) {
			log_debug("verbs: rereg failed after the MR was invalidated: %s",
				  strerror(-error));
			(void)ibv_dereg_mr(vmr->mr);
			vmr->mr = NULL;
			vmr->base.lkey = vmr->base.rkey = 0;
			vp->stats.pinned_bytes -= vmr->pinned;
			vmr->pinned = 0;
			return -ESTALE;
		}
		return error;
	}
	vmr->ibv_access = ibv_access;
	return 0;
}

/* The pinned count of a pinned MR moved to [addr, addr + length). */
static void count_pinned(struct verbs_provider *vp, struct verbs_mr *vmr, void *addr,
			 size_t length)
{
	if (vmr->base.access & MRD_ACCESS_ON_DEMAND)
		return;
	vp->stats.pinned_bytes -= vmr->pinned;
	vmr->pinned = page_span((uintptr_t)addr, length);
	vp->stats.pinned_bytes += vmr->pinned;
}

static int verbs_rereg(struct provider_mr *base, unsigned flags, void *addr, size_t length,
		       uint64_t iova, unsigned access)
{
	struct verbs_mr *vmr = (struct verbs_mr *)base;
	struct verbs_provider *vp = to_verbs(base->pd->provider);
	int r;

	if (flags & PROVIDER_REREG_TRANSLATION) {
		if (!vp->base.caps.rereg_translation)
			return -EOPNOTSUPP;
		/* ibv_rereg_mr has no iova: a moved MR is addressed by its virtual address. */
		if (iova != (uintptr_t)addr)
			return -EINVAL;
	} else if (vmr->parked)
		return -EINVAL; /* it has no memory whose access could change */
	else {
		addr = NULL;
		length = 0;
		iova = base->iova;
	}
	r = mr_rereg(vp, vmr, addr, length, to_ibv_access(access));
	if (r < 0)
		return r;
	mr_sync(vmr, iova);
	base->access = access;
	if (flags & PROVIDER_REREG_TRANSLATION)
		count_pinned(vp, vmr, addr, length);
	if (flags & PROVIDER_REREG_TRANSLATION && vmr->parked) {
		vmr->parked = false;
		vp->stats.parked--;
		vp->stats.mrs++;
	}
	return 0;
}

/* Verbs has no "detach": the MR moves to the provider's parking page granting nothing (access
 * 0, or ON_DEMAND alone, which provider_rereg would not take: it checks a registration's
 * rules), so its keys — the same
 * ones, on a driver that keeps them — reach nothing, and the client memory it pinned is let
 * go. base->access stays what the MR is for: a pool's move gives it back. New keys after the
 * move: the driver made the MR anew (mlx5's create_real_mr, when its UMR cannot drop the
 * access, hw/mlx5/mr.c can_use_umr_rereg_access), and the old mkey went back to the
 * device's cache: returns 1 (provider.h). */
static int verbs_park(struct provider_mr *base)
{
	struct verbs_provider *vp = to_verbs(base->pd->provider);
	struct verbs_mr *vmr = (struct verbs_mr *)base;
	uint32_t lkey = base->lkey, rkey = base->rkey;
	int r;

	if (!vp->parking || !vp->base.caps.rereg_translation)
		return -EOPNOTSUPP;
	/* ON_DEMAND alone grants nothing, and keeps the MR what it is (provider_rereg's rule:
	 * pinned <-> on demand is a new registration). */
	r = mr_rereg(vp, vmr, vp->parking, vp->base.caps.page_size,
		     to_ibv_access(base->access & MRD_ACCESS_ON_DEMAND));
	if (r < 0)
		return r;
	mr_sync(vmr, (uintptr_t)vp->parking);
	count_pinned(vp, vmr, vp->parking, vp->base.caps.page_size);
	if (!vmr->parked) {
		vmr->parked = true;
		vp->stats.mrs--;
		vp->stats.parked++;
	}
	return base->lkey != lkey || base->rkey != rkey ? 1 : 0;
}

/* To a PD of the provider's own that no QP uses, the PD alone changed: mlx5 does that in place
 * with a UMR on the same mkey, for an on-demand MR too (Linux 6.1 drivers/infiniband/hw/mlx5/
 * mr.c:1647-1658: without IB_MR_REREG_TRANS and with the access unchanged,
 * can_use_umr_rereg_access holds and mlx5r_umr_rereg_pd_access runs), where a move would make
 * it anew and give its mkey back to the cache (mr.c:1683). Its keys then reach nothing: a QP
 * takes only MRs of its own PD. */
static int verbs_park_in_place(struct provider_mr *base)
{
	struct verbs_provider *vp = to_verbs(base->pd->provider);
	struct verbs_mr *vmr = (struct verbs_mr *)base;
	uint32_t lkey = base->lkey, rkey = base->rkey;
	int r;

	if (vmr->lost || !vp->ctx)
		return -ENODEV;
	if (!vmr->mr)
		return -ESTALE;
	errno = 0;
	if (!vp->parking_pd && !(vp->parking_pd = ibv_alloc_pd(vp->ctx)))
		return negative_errno();
	r = ibv_rereg_mr(vmr->mr, IBV_REREG_MR_CHANGE_PD, vp->parking_pd, NULL, 0, 0);
	if (r != 0)
		return negative_errno(); /* the MR as it was: the caller destroys it */
	base->lkey = vmr->mr->lkey;
	base->rkey = vmr->mr->rkey;
	if (!vmr->parked) {
		vmr->parked = true;
		vp->stats.mrs--;
		vp->stats.parked++;
	}
	return base->lkey != lkey || base->rkey != rkey ? 1 : 0;
}

static int verbs_advise(struct provider_mr *base, enum provider_advice advice, uint64_t iova,
			size_t length)
{
	struct verbs_mr *vmr = (struct verbs_mr *)base;
	struct ibv_sge sge = { .addr = iova, .length = (uint32_t)length, .lkey = base->lkey };
	enum ibv_advise_mr_advice a;

	struct verbs_provider *vp = to_verbs(base->pd->provider);
	int r;

	if (!(base->access & MRD_ACCESS_ON_DEMAND))
		return -EINVAL;
	if (length == 0 || length > UINT32_MAX)
		return -EINVAL;
	if (advice == PROVIDER_ADVISE_PREFETCH)
		a = IBV_ADVISE_MR_ADVICE_PREFETCH;
	else if (advice == PROVIDER_ADVISE_PREFETCH_WRITE) {
		if (!(base->access & MRD_ACCESS_LOCAL_WRITE))
			return -EACCES;
		a = IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE;
	} else if (advice == PROVIDER_ADVISE_PREFETCH_NO_FAULT)
		a = IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT; /* mlx5, rxe with ODP: EOPNOTSUPP elsewhere */
	else
		return -EINVAL;
	/* Without our lock (provider_advise): rdma-core's ibv_cmd_advise_mr (libibverbs/cmd_mr.c)
	 * is one ioctl, UVERBS_METHOD_ADVISE_MR, on pd->context, which the kernel orders against
	 * a dereg itself; vmr stays as it is while the caller counts on it. FLUSH: return once
	 * the pages are present, so callers may count on them. */
	pthread_rwlock_rdlock(&vp->live); /* vmr->mr stays while verbs_lose waits */
	if (vmr->lost)
		r = -ENODEV;
	else if (!vmr->mr)
		r = -EINVAL;
	else
		r = verbs_ret(ibv_advise_mr(vmr->mr->pd, a, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1));
	pthread_rwlock_unlock(&vp->live);
	return r;
}

static int verbs_cmd_fd(struct provider *p)
{
	const struct verbs_provider *vp = to_verbs(p);

	return vp->ctx ? vp->ctx->cmd_fd : -1;
}

static int verbs_export_pd(struct provider_pd *base, int *ret_cmd_fd, uint32_t *ret_pd_handle)
{
	struct verbs_pd *vpd = (struct verbs_pd *)base;
	int fd;

	if (!vpd->pd)
		return -ENODEV;
	fd = fcntl(to_verbs(base->provider)->ctx->cmd_fd, F_DUPFD_CLOEXEC, 3);
	if (fd < 0)
		return negative_errno();
	*ret_cmd_fd = fd;
	*ret_pd_handle = vpd->pd->handle;
	return 0;
}

/* The PD's loopback made, or its pair replaced when the last replace failed; both locks held. */
static int loopback_mend(struct verbs_pd *vpd)
{
	if (!vpd->pd)
		return -ENODEV;
	if (!vpd->loopback)
		return loopback_set(vpd, vpd->pd);
	if (!verbs_loopback_ready(vpd->loopback))
		return verbs_loopback_replace(vpd->loopback);
	return 0;
}

/* The device does the transfer, on the PD's loopback QPs, and judges the keys itself. */
static int verbs_dma(struct provider_pd *base, enum provider_dma_op op, uint32_t lkey,
		     uint64_t laddr, uint32_t rkey, uint64_t raddr, size_t length)
{
	struct verbs_pd *vpd = (struct verbs_pd *)base;
	int r;

	if (op != PROVIDER_DMA_WRITE && op != PROVIDER_DMA_READ)
		return -EINVAL;
	pthread_mutex_lock(&vpd->dma_lock);
	pthread_mutex_lock(&vpd->win_lock);
	r = loopback_mend(vpd);
	pthread_mutex_unlock(&vpd->win_lock);
	if (r < 0)
		goto out;
	r = verbs_loopback_transfer(vpd->loopback, op == PROVIDER_DMA_READ, lkey, laddr, rkey,
				    raddr, length);
	if (r < 0 && r != -EFAULT) { /* -EFAULT: refused before anything was posted */
		(void)verbs_loopback_settle(vpd->loopback); /* before win_lock: the loop's */
		pthread_mutex_lock(&vpd->win_lock);
		/* A refused key left the QPs in the error state: mended, the windows bound on
		 * them kept (verbs_loopback_mend). Anything else may be the port or its address
		 * gone: the next Dma makes a loopback afresh (verbs-loopback.h), unless windows
		 * are bound through it, which must stay. */
		if (r == -EKEYREJECTED || verbs_loopback_has_windows(vpd->loopback))
			(void)verbs_loopback_mend(vpd->loopback);
		else
			(void)loopback_set(vpd, NULL);
		pthread_mutex_unlock(&vpd->win_lock);
	}
out:
	pthread_mutex_unlock(&vpd->dma_lock);
	return r;
}

/* Window ops run on mrd's loop, which must never wait for a transfer: where one needs the pair
 * made or mended (dma_lock first, the lock order) and a Dma holds dma_lock, it does not wait.
 * That Dma made the loopback (or found it) before its transfer, and replaces the pair if the
 * transfer fails on it, as it does when the answering QP is in the error state. */

/* Returns with win_lock held and r: 0 when the PD's loopback is ready for a window op, -EAGAIN
 * when it needs making or mending while a Dma is under way. */
static int window_enter(struct verbs_pd *vpd)
{
	int r;

	pthread_mutex_lock(&vpd->win_lock);
	if (vpd->loopback && verbs_loopback_ready(vpd->loopback))
		return 0;
	pthread_mutex_unlock(&vpd->win_lock);
	if (pthread_mutex_trylock(&vpd->dma_lock) != 0) {
		pthread_mutex_lock(&vpd->win_lock);
		return -EAGAIN;
	}
	pthread_mutex_lock(&vpd->win_lock);
	r = loopback_mend(vpd);
	pthread_mutex_unlock(&vpd->dma_lock);
	return r;
}

/* A window op failed on the pair of generation gen (win_lock held, and again on return): the
 * QPs are in the error state. Mended meanwhile by the Dma thread (its refused key broke them
 * under the op): true, try once more. Else false, and this mends them (verbs_loopback_mend),
 * unless a Dma is under way: its transfer then fails on the broken pair and the Dma thread
 * mends it (until then window ops fail). */
static bool window_failed(struct verbs_pd *vpd, unsigned gen)
{
	bool again, dma_idle;

	pthread_mutex_unlock(&vpd->win_lock);
	dma_idle = pthread_mutex_trylock(&vpd->dma_lock) == 0;
	pthread_mutex_lock(&vpd->win_lock);
	again = vpd->loopback && verbs_loopback_generation(vpd->loopback) != gen;
	if (vpd->loopback && !again && dma_idle)
		(void)verbs_loopback_mend(vpd->loopback);
	if (dma_idle)
		pthread_mutex_unlock(&vpd->dma_lock);
	return again && verbs_loopback_ready(vpd->loopback);
}

static int verbs_mw_alloc(struct provider_pd *base, struct provider_mw **ret)
{
	struct verbs_provider *vp = to_verbs(base->provider);
	struct verbs_pd *vpd = (struct verbs_pd *)base;
	struct verbs_mw *vmw;
	int r;

	if (!vp->ctx || !vpd->pd)
		return -ENODEV;
	vmw = calloc(1, sizeof(*vmw));
	if (!vmw)
		return -ENOMEM;
	vmw->mw = ibv_alloc_mw(vpd->pd, IBV_MW_TYPE_2);
	if (!vmw->mw) {
		r = negative_errno();
		free(vmw);
		return r;
	}
	vmw->base.pd = base;
	vmw->base.rkey = vmw->mw->rkey;
	LIST_INSERT_HEAD(&vp->mws, vmw, link);
	vp->stats.mws++;
	*ret = &vmw->base;
	return 0;
}

/* Posted on the PD's loopback, made here if it has none yet; its window lock, under the
 * provider's (as verbs_lose takes them). */
static int verbs_mw_bind(struct provider_mw *base, struct provider_mr *mr, uint64_t addr,
			 uint64_t length, unsigned access, uint32_t *ret_rkey)
{
	struct verbs_pd *vpd = (struct verbs_pd *)base->pd;
	struct verbs_mw *vmw = (struct verbs_mw *)base;
	struct verbs_mr *vmr = (struct verbs_mr *)mr;
	uint32_t rkey = ibv_inc_rkey(base->rkey);
	int r = 0;

	if (!vmw->mw || !vmr->mr || vmr->lost)
		return -ENODEV;
	if (vmr->parked)
		return -EINVAL; /* it grants nothing, MW_BIND included (verbs_park) */
	r = window_enter(vpd);
	for (int tries = 0; r == 0; tries++) {
		unsigned gen = verbs_loopback_generation(vpd->loopback);

		r = verbs_loopback_bind(vpd->loopback, vmw->mw, vmr->mr, addr, length,
					to_ibv_access(access), rkey, &vmw->pair);
		if (r == 0 || !window_failed(vpd, gen) || tries > 0)
			break;
		r = 0;
	}
	pthread_mutex_unlock(&vpd->win_lock);
	if (r < 0)
		return r;
	/* The next bind names the window by its key as the device has it now: rxe_bind_mw
	 * refuses a bind whose mw_rkey (librxe: ibv_mw->rkey) is not the window's current key,
	 * and libibverbs leaves it to the caller to follow a type-2 bind's key. */
	vmw->mw->rkey = rkey;
	*ret_rkey = rkey;
	return 0;
}

static int verbs_mw_invalidate(struct provider_mw *base, struct provider_mr *mr)
{
	struct verbs_pd *vpd = (struct verbs_pd *)base->pd;
	struct verbs_mw *vmw = (struct verbs_mw *)base;
	int r;

	(void)mr;
	if (!vmw->mw || !vmw->pair)
		return -ENODEV;
	r = window_enter(vpd);
	for (int tries = 0; r == 0; tries++) {
		unsigned gen = verbs_loopback_generation(vpd->loopback);

		r = verbs_loopback_invalidate(vpd->loopback, base->rkey, vmw->pair);
		if (r == 0 || !window_failed(vpd, gen) || tries > 0)
			break;
		r = 0;
	}
	pthread_mutex_unlock(&vpd->win_lock);
	if (r == 0)
		vmw->pair = NULL;
	return r;
}

static int verbs_mw_dealloc(struct provider_mw *base, struct provider_mr *mr)
{
	struct verbs_provider *vp = to_verbs(base->pd->provider);
	struct verbs_pd *vpd = (struct verbs_pd *)base->pd;
	struct verbs_mw *vmw = (struct verbs_mw *)base;

	(void)mr;
	if (vmw->mw) { /* NULL: deallocated when its device was lost */
		int r = verbs_ret(ibv_dealloc_mw(vmw->mw));

		if (r < 0)
			return r;
	}
	if (vmw->pair) {
		pthread_mutex_lock(&vpd->win_lock);
		verbs_loopback_unbound(vpd->loopback, vmw->pair);
		pthread_mutex_unlock(&vpd->win_lock);
	}
	LIST_REMOVE(vmw, link);
	if (vmw->mw)
		vp->stats.mws--;
	free(vmw);
	return 0;
}

/* The event path runs under event_lock alone (provider.h): ctx, the PDs and their loopbacks
 * change under it. ibv_get_async_event is one read(2) of async_fd and the driver's
 * async_event op; ibv_ack_async_event locks the element's own mutex (rdma-core
 * libibverbs/device.c): neither touches what the provider's lock guards. */
static int verbs_event_fd(struct provider *p)
{
	return to_verbs(p)->ctx ? to_verbs(p)->ctx->async_fd : -1;
}

/* A QP, CQ, SRQ or WQ event's element is mrd's only when it is a loopback's. */
static bool owns_element(const struct verbs_provider *vp, const void *element)
{
	const struct verbs_pd *vpd;

	LIST_FOREACH(vpd, &vp->pds, link)
		if (verbs_loopback_owns(vpd->loopback, element))
			return true;
	return false;
}

/* libibverbs' ibv_get_async_event (libibverbs/device.c) reads the kernel's event and casts its
 * element, the user_handle the object's creator chose, to a pointer, reading nothing through
 * it (the driver's async_event op, mlx5_async_event in providers/mlx5/verbs.c, looks at
 * DEVICE_FATAL alone); ibv_ack_async_event locks and signals through element->cq/qp/srq/wq.
 * A client that imported this context (export_pd) shares its event queue: an event of one of
 * its objects comes here with its pointer, which is never acknowledged, nor touched. */
static int verbs_read_event(struct provider *p, struct provider_event *ret)
{
	struct verbs_provider *vp = to_verbs(p);
	struct ibv_async_event ev;
	const void *element = NULL;
	bool object = true; /* an event of a QP, CQ, SRQ or WQ */

	if (!vp->ctx)
		return -EAGAIN;
	if (ibv_get_async_event(vp->ctx, &ev) != 0)
		return errno == EAGAIN || errno == EWOULDBLOCK ? -EAGAIN : negative_errno();
	*ret = (struct provider_event){ .kind = PROVIDER_EVENT_OTHER,
					.name = ibv_event_type_str(ev.event_type) };
	switch (ev.event_type) {
	case IBV_EVENT_DEVICE_FATAL:
		ret->kind = PROVIDER_EVENT_DEVICE_FATAL;
		object = false;
		break;
	case IBV_EVENT_PORT_ACTIVE:
		ret->kind = PROVIDER_EVENT_PORT_ACTIVE;
		ret->port = (unsigned)ev.element.port_num;
		object = false;
		break;
	case IBV_EVENT_PORT_ERR:
		ret->kind = PROVIDER_EVENT_PORT_DOWN;
		ret->port = (unsigned)ev.element.port_num;
		object = false;
		break;
	case IBV_EVENT_CQ_ERR:
		element = ev.element.cq;
		break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		element = ev.element.qp;
		break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		element = ev.element.srq;
		break;
	case IBV_EVENT_WQ_FATAL:
		element = ev.element.wq;
		break;
	default:
		object = false; /* the device's or a port's: ours to acknowledge */
		break;
	}
	if (object && !owns_element(vp, element)) {
		ret->kind = PROVIDER_EVENT_FOREIGN;
		return 0;
	}
	ibv_ack_async_event(&ev);
	return 0;
}

/* libibverbs' dev_path is the uverbs node in sysfs (/sys/class/infiniband_verbs/uverbsN).
 * A removal deletes it first (Linux 6.12 drivers/infiniband/core/uverbs_main.c,
 * ib_uverbs_remove_one: cdev_device_del), then, on a device without disassociate_ucontext
 * (rxe, siw, efa), waits for every open context to close: no event says so. */
static bool verbs_gone(struct provider *p)
{
	struct verbs_provider *vp = to_verbs(p);
	struct stat st;

	return vp->ctx && vp->dev_path[0] && stat(vp->dev_path, &st) < 0 && errno == ENOENT;
}

/* RDMAV_ALLOW_DISASSOC_DESTROY (main.c) makes each destroy on a disassociated context succeed
 * (libibverbs/init.c, cmd.c verbs_is_destroy_err): the kernel freed it already. */
static void verbs_lose(struct provider *p)
{
	struct verbs_provider *vp = to_verbs(p);
	struct verbs_kept *kept;
	struct verbs_mr *vmr;
	struct verbs_mw *vmw;
	struct verbs_pd *vpd;

	if (!vp->ctx)
		return;
	kept = calloc(1, sizeof(*kept));
	pthread_rwlock_wrlock(&vp->live);
	/* Windows first: rxe refuses to deregister an MR with one bound (rxe_dereg_mr), and a
	 * window holds its loopback QP. Each is free when the device comes back (verbs_revive). */
	LIST_FOREACH(vmw, &vp->mws, link) {
		if (!vmw->mw)
			continue;
		(void)ibv_dealloc_mw(vmw->mw);
		vmw->mw = NULL;
		vmw->pair = NULL; /* its loopback goes below */
		vp->stats.mws--;
		if (vmw->base.mr) {
			vmw->base.mr->n_mws--;
			vmw->base.mr = NULL;
		}
	}
	LIST_FOREACH(vmr, &vp->mrs, link) {
		if (vmr->lost)
			continue;
		vmr->lost = true;
		vmr->base.lkey = vmr->base.rkey = 0;
		/* Refused (a device not disassociated, e.g. a window bound to it): it stays, and
		 * counted, so verbs_dereg tries again and mrd's quarantine holds its run. */
		if (vmr->mr && ibv_dereg_mr(vmr->mr) != 0 && kept && !vmr->kept_mr) {
			vmr->kept_mr = vmr->mr;
			vmr->mr = NULL;
			vmr->kept = kept;
			kept->mrs++;
			continue;
		}
		vmr->mr = NULL; /* refused, but no memory for kept (or one kept already): forgotten */
		if (vmr->kept_mr)
			continue; /* counted still, as the registration a lost context kept */
		if (vmr->parked)
			vp->stats.parked--;
		else
			vp->stats.mrs--;
		vp->stats.pinned_bytes -= vmr->pinned;
		vmr->pinned = 0;
	}
	if (vp->parking_pd) /* EBUSY under a kept MR: goes with kept->ctx */
		(void)ibv_dealloc_pd(vp->parking_pd);
	vp->parking_pd = NULL;
	LIST_FOREACH(vpd, &vp->pds, link) { /* NULL ones: a revive that failed partway */
		pthread_mutex_lock(&vpd->dma_lock);
		pthread_mutex_lock(&vpd->win_lock);
		(void)loopback_set(vpd, NULL);
		if (vpd->pd)
			(void)ibv_dealloc_pd(vpd->pd); /* EBUSY under a kept MR: goes with kept->ctx */
		vpd->pd = NULL;
		pthread_mutex_unlock(&vpd->win_lock);
		pthread_mutex_unlock(&vpd->dma_lock);
	}
	pthread_mutex_lock(&p->event_lock); /* the event path reads ctx */
	if (kept && kept->mrs) {
		kept->ctx = vp->ctx;
		LIST_INSERT_HEAD(&vp->kept, kept, link);
	} else {
		(void)ibv_close_device(vp->ctx);
		free(kept);
	}
	vp->ctx = NULL;
	pthread_mutex_unlock(&p->event_lock);
	pthread_rwlock_unlock(&vp->live);
}

/* A lost MR made again where it was (a parked one on the parking page). */
static int register_again(struct verbs_provider *vp, struct verbs_mr *vmr)
{
	struct verbs_pd *vpd = (struct verbs_pd *)vmr->base.pd;
	void *addr = vmr->parked ? vp->parking : (void *)(uintptr_t)vmr->base.addr;
	size_t length = vmr->parked ? vp->base.caps.page_size : vmr->base.length;
	uint64_t iova = vmr->parked ? (uintptr_t)vp->parking : vmr->base.iova;

	unsigned access = vmr->parked ? to_ibv_access(vmr->base.access & MRD_ACCESS_ON_DEMAND) :
					to_ibv_access(vmr->base.access);

	vmr->mr = ibv_reg_mr_iova2(vpd->pd, addr, length, iova, access);
	if (!vmr->mr)
		return negative_errno();
	vmr->ibv_access = access; /* a parked one grants nothing, as verbs_park left it */
	vmr->lost = false;
	mr_sync(vmr, iova);
	if (vmr->kept_mr)
		return 0; /* counted still, as its old registration (which pins the same pages) */
	if (!vmr->parked && !(vmr->base.access & MRD_ACCESS_ON_DEMAND))
		vmr->pinned = page_span((uintptr_t)addr, length);
	if (vmr->parked)
		vp->stats.parked++;
	else
		vp->stats.mrs++;
	vp->stats.pinned_bytes += vmr->pinned;
	return 0;
}

static int verbs_revive(struct provider *p)
{
	struct verbs_provider *vp = to_verbs(p);
	char name[sizeof(vp->base.caps.device)];
	struct verbs_mr *vmr;
	struct verbs_mw *vmw;
	struct verbs_pd *vpd;
	int r;

	if (vp->ctx)
		return 0;
	snprintf(name, sizeof(name), "%s", vp->base.caps.device);
	pthread_mutex_lock(&p->event_lock); /* the event path reads ctx */
	r = open_context(vp, name);
	pthread_mutex_unlock(&p->event_lock);
	if (r < 0)
		return r;
	vp->base.caps.port_active = port_active(vp->ctx);
	LIST_FOREACH(vpd, &vp->pds, link) {
		vpd->pd = ibv_alloc_pd(vp->ctx);
		if (!vpd->pd) {
			r = negative_errno();
			verbs_lose(p);
			return r;
		}
	}
	/* Every MR comes back, or the device does not: one left lost would hand out keys 0 from
	 * the domain's table (rebuilt from them). One whose old registration the lost context
	 * kept (kept_mr) gets a new one here too; the old waits for its dereg. */
	LIST_FOREACH(vmr, &vp->mrs, link) {
		if (!vmr->lost)
			continue;
		r = register_again(vp, vmr);
		if (r < 0) {
			log_warning_errno(r, "verbs: %s: cannot register [0x%llx, +%llu) again: %m",
					  name, (unsigned long long)vmr->base.addr,
					  (unsigned long long)vmr->base.length);
			verbs_lose(p);
			return r;
		}
	}
	LIST_FOREACH(vmw, &vp->mws, link) {
		vmw->mw = ibv_alloc_mw(((struct verbs_pd *)vmw->base.pd)->pd, IBV_MW_TYPE_2);
		if (!vmw->mw) {
			r = negative_errno();
			verbs_lose(p);
			return r;
		}
		vmw->base.rkey = vmw->mw->rkey;
		vp->stats.mws++;
	}
	return 0;
}

static void verbs_stats(const struct provider *p, struct provider_stats *ret)
{
	*ret = ((const struct verbs_provider *)p)->stats;
}

const struct provider_ops provider_verbs_ops = {
	.name = "verbs",
	.open = verbs_open,
	.close = verbs_close,
	.pd_alloc = verbs_pd_alloc,
	.pd_free = verbs_pd_free,
	.reg = verbs_reg,
	.rereg = verbs_rereg,
	.dereg = verbs_dereg,
	.park = verbs_park,
	.park_in_place = verbs_park_in_place,
	.advise = verbs_advise,
	.export_pd = verbs_export_pd,
	.cmd_fd = verbs_cmd_fd,
	.dma = verbs_dma,
	.mw_alloc = verbs_mw_alloc,
	.mw_bind = verbs_mw_bind,
	.mw_invalidate = verbs_mw_invalidate,
	.mw_dealloc = verbs_mw_dealloc,
	.stats = verbs_stats,
	.event_fd = verbs_event_fd,
	.read_event = verbs_read_event,
	.gone = verbs_gone,
	.lose = verbs_lose,
	.revive = verbs_revive,
};

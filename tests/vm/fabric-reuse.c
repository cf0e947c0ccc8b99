/*
 * fabric-reuse: an ordinary libfabric program (no libmrd) for make check-rdma's middleware
 * cases. Two RDM endpoints of one domain (verbs;ofi_rxm by default) send 1 MiB messages to each
 * other: rxm's rendezvous registers the user's buffers itself, through the provider's MR cache.
 * The buffers are freed and allocated again at the same address (malloc/free with mmap'd chunks,
 * mmap/munmap; or, with "heap", malloc/free on the heap, where the two buffers share a page), new
 * data in them each time, so a cache that missed the free would move stale pages; the receiver
 * checks every byte. Under libmrd-preload.so the cache's monitor (FI_MR_CACHE_MONITOR:
 * memhooks, userfaultfd, disabled) and the shim both watch free and munmap. Prints
 * "fabric-reuse: ..." lines; exit 0 when every transfer's data was right and each kind of
 * reuse really came back to its address. A transfer that completes in no 30 s fails (one takes
 * well under a second in the TCG VM; rxm leaves a send whose registration failed waiting for
 * ever).
 *
 * fabric-reuse [domain [iterations [heap]]]
 */
#include <malloc.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define LEN (1u << 20) /* past rxm's eager and SAR limits: rendezvous, zero copy */

struct side {
	struct fid_ep *ep;
	struct fid_cq *cq;
	struct fid_av *av;
	fi_addr_t peer;
};

static struct side a, b;
static struct timespec started; /* the transfer's */
static const char *phase;

static void deadline(void)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	if (now.tv_sec - started.tv_sec > 30) {
		printf("fabric-reuse: FAIL %s: a transfer did not complete in 30 s\n", phase);
		exit(1);
	}
}

#define CHECK(call)                                                                          \
	do {                                                                                 \
		int rc_ = (int)(call);                                                       \
		if (rc_ < 0) {                                                               \
			printf("fabric-reuse: FAIL %s: %s (%d)\n", #call, fi_strerror(-rc_), \
			       rc_);                                                         \
			exit(1);                                                             \
		}                                                                            \
	} while (0)

/* One completion from side s, progressing both (manual progress). */
static void wait_one(struct side *s, struct side *other)
{
	struct fi_cq_entry e;
	for (;;) {
		ssize_t n = fi_cq_read(s->cq, &e, 1);
		if (n == 1)
			return;
		if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry err = {0};
			fi_cq_readerr(s->cq, &err, 0);
			printf("fabric-reuse: FAIL completion error: %s (%d, provider %d)\n",
			       fi_strerror(err.err), err.err, err.prov_errno);
			exit(1);
		}
		if (n != -FI_EAGAIN)
			CHECK(n);
		fi_cq_read(other->cq, NULL, 0); /* progress only */
		deadline();
	}
}

static void fill(unsigned char *p, unsigned seed)
{
	for (size_t i = 0; i < LEN; i++)
		p[i] = (unsigned char)(i * 7 + seed * 131 + (i >> 12));
}

/* One message a -> b; 0 when b got exactly what a sent. */
static int transfer(unsigned char *src, unsigned char *dst, unsigned seed)
{
	struct fi_context2 rctx, sctx;
	ssize_t rc;

	clock_gettime(CLOCK_MONOTONIC, &started);
	fill(src, seed);
	memset(dst, 0, LEN);
	CHECK(fi_recv(b.ep, dst, LEN, NULL, b.peer, &rctx));
	while ((rc = fi_send(a.ep, src, LEN, NULL, a.peer, &sctx)) == -FI_EAGAIN) {
		fi_cq_read(a.cq, NULL, 0);
		fi_cq_read(b.cq, NULL, 0);
		deadline();
	}
	CHECK(rc);
	wait_one(&a, &b);
	wait_one(&b, &a);
	for (size_t i = 0; i < LEN; i++) {
		unsigned char want = (unsigned char)(i * 7 + seed * 131 + (i >> 12));
		if (dst[i] != want) {
			printf("fabric-reuse: FAIL %s: byte %zu of transfer %u: %#x, sent %#x\n",
			       phase, i, seed, dst[i], want);
			return 1;
		}
	}
	return 0;
}

static void *map_at(void *hint)
{
	void *p = mmap(hint, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("fabric-reuse: FAIL mmap");
		exit(1);
	}
	return p;
}

static void open_side(struct fid_domain *domain, struct fi_info *info, struct side *s)
{
	struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT, .size = 128};
	struct fi_av_attr av_attr = {.type = FI_AV_MAP};

	CHECK(fi_cq_open(domain, &cq_attr, &s->cq, NULL));
	CHECK(fi_av_open(domain, &av_attr, &s->av, NULL));
	CHECK(fi_endpoint(domain, info, &s->ep, NULL));
	CHECK(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV));
	CHECK(fi_ep_bind(s->ep, &s->av->fid, 0));
	CHECK(fi_enable(s->ep));
}

static void insert_peer(struct side *s, struct side *peer)
{
	char name[256];
	size_t len = sizeof(name);
	CHECK(fi_getname(&peer->ep->fid, name, &len));
	if (fi_av_insert(s->av, name, 1, &s->peer, 0, NULL) != 1) {
		printf("fabric-reuse: FAIL fi_av_insert\n");
		exit(1);
	}
}

int main(int argc, char **argv)
{
	const char *dom = argc > 1 && argv[1][0] ? argv[1] : NULL;
	unsigned iters = argc > 2 ? (unsigned)atoi(argv[2]) : 8, seed = 0, reused[2] = {0};
	int heap = argc > 3 && strcmp(argv[3], "heap") == 0;
	struct fi_info *hints = fi_allocinfo(), *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	int bad = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	hints->ep_attr->type = FI_EP_RDM;
	hints->caps = FI_MSG;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	/* No FI_MR_LOCAL: the provider registers the program's buffers (its MR cache). */
	hints->domain_attr->mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	hints->fabric_attr->prov_name = strdup(getenv("FABRIC_PROV") ? getenv("FABRIC_PROV")
								      : "verbs;ofi_rxm");
	if (dom)
		hints->domain_attr->name = strdup(dom);
	CHECK(fi_getinfo(FI_VERSION(1, 17), NULL, NULL, 0, hints, &info));
	printf("fabric-reuse: provider %s, domain %s, monitor %s\n", info->fabric_attr->prov_name,
	       info->domain_attr->name,
	       getenv("FI_MR_CACHE_MONITOR") ? getenv("FI_MR_CACHE_MONITOR") : "default");
	CHECK(fi_fabric(info->fabric_attr, &fabric, NULL));
	CHECK(fi_domain(fabric, info, &domain, NULL));
	open_side(domain, info, &a);
	open_side(domain, info, &b);
	insert_peer(&a, &b);
	insert_peer(&b, &a);

	void *last_s = NULL, *last_d = NULL;
	if (heap) {
		/* malloc/free on the heap: the same chunks again, their pages never unmapped. */
		phase = "heap";
		mallopt(M_MMAP_THRESHOLD, 32 << 20);
		mallopt(M_TRIM_THRESHOLD, 256 << 20);
		for (unsigned i = 0; i < iters; i++) {
			unsigned char *s = malloc(LEN), *d = malloc(LEN);
			if (!s || !d)
				return printf("fabric-reuse: FAIL malloc\n"), 1;
			reused[0] += s == last_s || d == last_d;
			bad |= transfer(s, d, seed++);
			last_s = s, last_d = d;
			free(s);
			free(d);
		}
		reused[1] = 1;
	} else {
		/* malloc/free, chunks of their own mappings: free unmaps them, malloc maps again. */
		phase = "malloc'd mappings";
		mallopt(M_MMAP_THRESHOLD, 64 << 10); /* fixed: glibc would raise it after a free */
		for (unsigned i = 0; i < iters; i++) {
			unsigned char *s = malloc(LEN), *d = malloc(LEN);
			if (!s || !d)
				return printf("fabric-reuse: FAIL malloc\n"), 1;
			reused[0] += s == last_s || d == last_d;
			bad |= transfer(s, d, seed++);
			last_s = s, last_d = d;
			free(s);
			free(d);
		}
		printf("fabric-reuse: %s: %u transfers\n", phase, iters);
		/* mmap/munmap, asking for the address just unmapped. */
		phase = "mmap";
		last_s = last_d = NULL;
		for (unsigned i = 0; i < iters; i++) {
			unsigned char *s = map_at(last_s), *d = map_at(last_d);
			reused[1] += s == last_s || d == last_d;
			bad |= transfer(s, d, seed++);
			last_s = s, last_d = d;
			munmap(s, LEN);
			munmap(d, LEN);
		}
	}
	fi_close(&a.ep->fid);
	fi_close(&b.ep->fid);
	fi_close(&a.av->fid);
	fi_close(&b.av->fid);
	fi_close(&a.cq->fid);
	fi_close(&b.cq->fid);
	fi_close(&domain->fid);
	fi_close(&fabric->fid);
	fi_freeinfo(info);
	fi_freeinfo(hints);
	if (heap)
		printf("fabric-reuse: %u transfers of %u bytes, %s; addresses reused: heap %u of %u\n",
		       seed, LEN, bad ? "DATA WRONG" : "data checked", reused[0], iters - 1);
	else
		printf("fabric-reuse: %u transfers of %u bytes, %s; addresses reused: malloc'd "
		       "mappings %u, mmap %u of %u\n",
		       seed, LEN, bad ? "DATA WRONG" : "data checked", reused[0], reused[1],
		       iters - 1);
	return bad || !reused[0] || !reused[1];
}

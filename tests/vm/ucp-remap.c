/*
 * ucp-remap: an ordinary UCX program (no libmrd) for make check-rdma's middleware cases. Two
 * UCP workers of one process (UCX_TLS=rc_verbs,ud_verbs,self: the wire between them is the
 * device) move 1 MiB messages, whose zero-copy rendezvous registers the program's buffers
 * through UCX's registration cache:
 *   tag: send and receive buffers mmap'd, munmap'd and mapped again at the same address;
 *   put: the target's buffer mapped with ucp_mem_map, its rkey sent over, written by
 *        ucp_put_nbx, then ucp_mem_unmap, munmap and mapped again at the same address, with a
 *        new rkey; the source an mmap'd buffer reused the same way.
 * New data each time, every byte checked by the receiver: a cache that missed the unmap would
 * move stale pages. Prints "ucp-remap: ..." lines; exit 0 when all data was right and the
 * addresses really came back.
 *
 * ucp-remap [iterations]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucp/api/ucp.h>

#define LEN (1u << 20)

static ucp_worker_h wa, wb;

#define CHECK(call)                                                                           \
	do {                                                                                  \
		ucs_status_t st_ = (call);                                                    \
		if (st_ != UCS_OK) {                                                          \
			printf("ucp-remap: FAIL %s: %s\n", #call, ucs_status_string(st_));    \
			exit(1);                                                              \
		}                                                                             \
	} while (0)

/* Progresses both workers until the request (or an immediate status) is done. */
static void wait_req(void *req, const char *what)
{
	ucs_status_t st;
	if (UCS_PTR_IS_ERR(req)) {
		printf("ucp-remap: FAIL %s: %s\n", what, ucs_status_string(UCS_PTR_STATUS(req)));
		exit(1);
	}
	if (req == NULL)
		return;
	while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) {
		ucp_worker_progress(wa);
		ucp_worker_progress(wb);
	}
	ucp_request_free(req);
	if (st != UCS_OK) {
		printf("ucp-remap: FAIL %s: %s\n", what, ucs_status_string(st));
		exit(1);
	}
}

static unsigned char want(size_t i, unsigned seed)
{
	return (unsigned char)(i * 13 + seed * 101 + (i >> 12));
}

static void fill(unsigned char *p, unsigned seed)
{
	for (size_t i = 0; i < LEN; i++)
		p[i] = want(i, seed);
}

static int verify(const unsigned char *p, unsigned seed, const char *what)
{
	for (size_t i = 0; i < LEN; i++)
		if (p[i] != want(i, seed)) {
			printf("ucp-remap: FAIL %s %u: byte %zu is %#x, sent %#x\n", what, seed, i,
			       p[i], want(i, seed));
			return 1;
		}
	return 0;
}

static unsigned char *map_at(void *hint)
{
	void *p = mmap(hint, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("ucp-remap: FAIL mmap");
		exit(1);
	}
	return p;
}

int main(int argc, char **argv)
{
	unsigned iters = argc > 1 ? (unsigned)atoi(argv[1]) : 8, seed = 0, reused[2] = {0};
	ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
			       .features = UCP_FEATURE_TAG | UCP_FEATURE_RMA};
	ucp_worker_params_t wparams = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
				       .thread_mode = UCS_THREAD_MODE_SINGLE};
	ucp_context_h ctx;
	ucp_config_t *config;
	ucp_address_t *addr;
	size_t addr_len;
	ucp_ep_h ep;
	int bad = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	CHECK(ucp_config_read(NULL, NULL, &config));
	CHECK(ucp_init(&params, config, &ctx));
	ucp_config_release(config);
	CHECK(ucp_worker_create(ctx, &wparams, &wa));
	CHECK(ucp_worker_create(ctx, &wparams, &wb));
	CHECK(ucp_worker_get_address(wb, &addr, &addr_len));
	ucp_ep_params_t eparams = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
				   .address = addr};
	CHECK(ucp_ep_create(wa, &eparams, &ep));
	ucp_worker_release_address(wb, addr);

	/* tag: both buffers plain mmap, unmapped and mapped again. */
	unsigned char *ls = NULL, *ld = NULL;
	for (unsigned i = 0; i < iters; i++, seed++) {
		unsigned char *s = map_at(ls), *d = map_at(ld);
		ucp_request_param_t rp = {0};
		reused[0] += s == ls || d == ld;
		fill(s, seed);
		memset(d, 0, LEN);
		void *rreq = ucp_tag_recv_nbx(wb, d, LEN, 42, ~0ull, &rp);
		void *sreq = ucp_tag_send_nbx(ep, s, LEN, 42, &rp);
		wait_req(sreq, "ucp_tag_send_nbx");
		wait_req(rreq, "ucp_tag_recv_nbx");
		bad |= verify(d, seed, "tag message");
		ls = s, ld = d;
		munmap(s, LEN);
		munmap(d, LEN);
	}
	/* put: the target's buffer through ucp_mem_map, a new rkey each time. */
	ls = ld = NULL;
	for (unsigned i = 0; i < iters; i++, seed++) {
		unsigned char *s = map_at(ls), *d = map_at(ld);
		ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
							 UCP_MEM_MAP_PARAM_FIELD_LENGTH,
					   .address = d,
					   .length = LEN};
		ucp_request_param_t rp = {0};
		ucp_mem_h memh;
		ucp_rkey_h rkey;
		void *rkey_buf;
		size_t rkey_len;

		reused[1] += s == ls || d == ld;
		fill(s, seed);
		memset(d, 0, LEN);
		CHECK(ucp_mem_map(ctx, &mp, &memh));
		CHECK(ucp_rkey_pack(ctx, memh, &rkey_buf, &rkey_len));
		CHECK(ucp_ep_rkey_unpack(ep, rkey_buf, &rkey));
		ucp_rkey_buffer_release(rkey_buf);
		wait_req(ucp_put_nbx(ep, s, LEN, (uint64_t)(uintptr_t)d, rkey, &rp), "ucp_put_nbx");
		wait_req(ucp_ep_flush_nbx(ep, &rp), "ucp_ep_flush_nbx");
		bad |= verify(d, seed, "put");
		ucp_rkey_destroy(rkey);
		CHECK(ucp_mem_unmap(ctx, memh));
		ls = s, ld = d;
		munmap(s, LEN);
		munmap(d, LEN);
	}
	ucp_request_param_t cp = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
				  .flags = UCP_EP_CLOSE_FLAG_FORCE};
	void *creq = ucp_ep_close_nbx(ep, &cp);
	if (creq && !UCS_PTR_IS_ERR(creq)) {
		while (ucp_request_check_status(creq) == UCS_INPROGRESS) {
			ucp_worker_progress(wa);
			ucp_worker_progress(wb);
		}
		ucp_request_free(creq);
	}
	ucp_worker_destroy(wa);
	ucp_worker_destroy(wb);
	ucp_cleanup(ctx);
	printf("ucp-remap: %u transfers of %u bytes (tag, put), %s; addresses reused: tag %u, put "
	       "%u of %u\n",
	       seed, LEN, bad ? "DATA WRONG" : "data checked", reused[0], reused[1], iters - 1);
	return bad || !reused[0] || !reused[1];
}

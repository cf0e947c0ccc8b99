/* SPDX-License-Identifier: MIT */
/* libmrd's hand-coded Request and Response envelopes: the same bytes and the same messages as
 * protobuf-c's generic code, which stays the fallback for anything else. */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"
#include "check-run.h"

/* envelope_pack_request's bytes are protobuf-c's. */
static void assert_packs_as_protobuf_c(const Mrd__Request *req)
{
	uint8_t mine[512], theirs[512];
	size_t len = 0, want = protobuf_c_message_get_packed_size(&req->base);

	ck_assert_uint_le(want, sizeof(theirs));
	protobuf_c_message_pack(&req->base, theirs);
	ck_assert_int_eq(envelope_pack_request(req, mine, sizeof(mine), &len), 0);
	ck_assert_uint_eq(len, want);
	ck_assert_mem_eq(mine, theirs, len);
	/* One byte short does not fit, and writes nothing past it. */
	if (want > 0) {
		memset(mine, 0xa5, sizeof(mine));
		ck_assert_int_eq(envelope_pack_request(req, mine, want - 1, &len), -EMSGSIZE);
		ck_assert_uint_eq(mine[want - 1], 0xa5);
	}
}

START_TEST(test_pack_request)
{
	static const uint64_t ids[] = { 0, 1, 127, 128, 300, 20000, UINT64_MAX };
	uint64_t starts[3] = { 0x1000, 1ull << 40, 5 }, lengths[3] = { 4096, 1, UINT64_MAX };
	Mrd__PingRequest ping = MRD__PING_REQUEST__INIT;
	Mrd__AllocRequest alloc = MRD__ALLOC_REQUEST__INIT;
	Mrd__FreeRequest free_req = MRD__FREE_REQUEST__INIT;
	Mrd__HelloRequest hello = MRD__HELLO_REQUEST__INIT;
	Mrd__MempoolRegisterRequest pool = MRD__MEMPOOL_REGISTER_REQUEST__INIT;

	ping.payload.data = (uint8_t *)"mrd-ping";
	ping.payload.len = 8;
	alloc.size = 1ull << 30;
	alloc.align = 4096;
	alloc.flags = 3;
	hello.min_version = 1;
	hello.max_version = 7;
	hello.capabilities = ~0ull;
	hello.client_name = (char *)"test-envelope";
	pool.name = (char *)"pool";
	pool.n_starts = pool.n_lengths = 3;
	pool.starts = starts;
	pool.lengths = lengths;
	pool.extmem = true;
	for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
		Mrd__Request req = MRD__REQUEST__INIT;

		req.id = ids[i];
		assert_packs_as_protobuf_c(&req); /* no body */
		req.body_case = MRD__REQUEST__BODY_PING;
		req.ping = &ping;
		assert_packs_as_protobuf_c(&req);
		req.body_case = MRD__REQUEST__BODY_ALLOC;
		req.alloc = &alloc;
		assert_packs_as_protobuf_c(&req);
		req.body_case = MRD__REQUEST__BODY_FREE; /* an empty body: a zero address */
		req.free = &free_req;
		assert_packs_as_protobuf_c(&req);
		req.body_case = MRD__REQUEST__BODY_HELLO;
		req.hello = &hello;
		assert_packs_as_protobuf_c(&req);
		req.body_case = MRD__REQUEST__BODY_MEMPOOL_REGISTER;
		req.mempool_register = &pool;
		assert_packs_as_protobuf_c(&req);
	}
}
END_TEST

START_TEST(test_pack_request_refuses_what_it_does_not_know)
{
	Mrd__Request req = MRD__REQUEST__INIT;
	uint8_t buf[64];
	size_t len;

	req.id = 5;
	req.body_case = MRD__REQUEST__BODY_PING; /* set, but no message */
	ck_assert_int_eq(envelope_pack_request(&req, buf, sizeof(buf), &len), -ENOTSUP);
	req.body_case = (Mrd__Request__BodyCase)99; /* no such member */
	ck_assert_int_eq(envelope_pack_request(&req, buf, sizeof(buf), &len), -ENOTSUP);
}
END_TEST

/* Unpacked by hand, a response packs again to the very bytes it came from. */
static Mrd__Response *assert_unpacks_as_protobuf_c(const Mrd__Response *resp)
{
	uint8_t buf[512], again[512];
	size_t len = protobuf_c_message_get_packed_size(&resp->base);
	Mrd__Response *got;

	ck_assert_uint_le(len, sizeof(buf));
	protobuf_c_message_pack(&resp->base, buf);
	got = envelope_unpack_response(buf, len);
	ck_assert_ptr_nonnull(got);
	ck_assert_uint_eq(got->id, resp->id);
	ck_assert_int_eq(got->status, resp->status);
	ck_assert_str_eq(got->message, resp->message);
	ck_assert_int_eq(got->body_case, resp->body_case);
	ck_assert_uint_eq(protobuf_c_message_get_packed_size(&got->base), len);
	protobuf_c_message_pack(&got->base, again);
	ck_assert_mem_eq(again, buf, len);
	return got;
}

START_TEST(test_unpack_response)
{
	static const int32_t statuses[] = { 0, 2, 110, -1, INT32_MIN };
	static const uint64_t ids[] = { 0, 1, 200, UINT64_MAX };
	Mrd__PingResponse ping = MRD__PING_RESPONSE__INIT;
	Mrd__AllocResponse alloc = MRD__ALLOC_RESPONSE__INIT;
	Mrd__ArenaInfo arena = MRD__ARENA_INFO__INIT;
	Mrd__FreeResponse free_resp = MRD__FREE_RESPONSE__INIT;

	ping.payload.data = (uint8_t *)"mrd-ping";
	ping.payload.len = 8;
	alloc.address = 0x7f0000000000;
	alloc.length = 1 << 21;
	alloc.arena = &arena;
	for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++)
		for (size_t j = 0; j < sizeof(statuses) / sizeof(statuses[0]); j++) {
			Mrd__Response resp = MRD__RESPONSE__INIT, *got;

			resp.id = ids[i];
			resp.status = statuses[j];
			mrd__response__free_unpacked(assert_unpacks_as_protobuf_c(&resp), NULL);
			resp.message = (char *)(j % 2 ? "no such thing" : "");
			resp.body_case = MRD__RESPONSE__BODY_PING;
			resp.ping = &ping;
			got = assert_unpacks_as_protobuf_c(&resp);
			ck_assert_mem_eq(got->ping->payload.data, "mrd-ping", 8);
			mrd__response__free_unpacked(got, NULL);
			resp.body_case = MRD__RESPONSE__BODY_ALLOC;
			resp.alloc = &alloc;
			got = assert_unpacks_as_protobuf_c(&resp);
			ck_assert_uint_eq(got->alloc->address, alloc.address);
			ck_assert_ptr_nonnull(got->alloc->arena);
			mrd__response__free_unpacked(got, NULL);
			resp.body_case = MRD__RESPONSE__BODY_FREE;
			resp.free = &free_resp;
			mrd__response__free_unpacked(assert_unpacks_as_protobuf_c(&resp), NULL);
		}
}
END_TEST

/* What the hand-coded path does not take goes to protobuf-c: the same result either way. */
START_TEST(test_unpack_response_falls_back)
{
	/* id 7, an unknown varint field 9 (=1), a ping body with payload "ab", the message "x"
	 * twice (last wins), then two bodies (the second wins). */
	static const uint8_t unknown[] = { 0x08, 0x07, 0x48, 0x01, 0x8a, 0x01, 0x04, 0x0a, 0x02, 'a', 'b' };
	static const uint8_t twice[] = { 0x08, 0x07, 0x1a, 0x01, 'x', 0x1a, 0x01, 'y',
					 0x8a, 0x01, 0x00, 0xaa, 0x01, 0x00 };
	static const uint8_t truncated[] = { 0x08, 0x07, 0x8a, 0x01, 0x04, 0x0a, 0x02, 'a' };
	static const uint8_t bad_body[] = { 0x08, 0x07, 0x8a, 0x01, 0x02, 0x0a, 0x05 };
	const struct { const uint8_t *data; size_t len; } cases[] = {
		{ unknown, sizeof(unknown) }, { twice, sizeof(twice) },
		{ truncated, sizeof(truncated) }, { bad_body, sizeof(bad_body) },
	};

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		Mrd__Response *got = envelope_unpack_response(cases[i].data, cases[i].len);
		Mrd__Response *want = mrd__response__unpack(NULL, cases[i].len, cases[i].data);
		uint8_t a[64], b[64];

		ck_assert_int_eq(got == NULL, want == NULL);
		if (!got)
			continue;
		ck_assert_uint_eq(protobuf_c_message_pack(&got->base, a),
				  protobuf_c_message_pack(&want->base, b));
		ck_assert_mem_eq(a, b, protobuf_c_message_get_packed_size(&got->base));
		ck_assert_int_eq(got->body_case, want->body_case);
		ck_assert_str_eq(got->message, want->message);
		mrd__response__free_unpacked(got, NULL);
		mrd__response__free_unpacked(want, NULL);
	}
	ck_assert_ptr_null(envelope_unpack_response(truncated, sizeof(truncated)));
}
END_TEST

int main(void)
{
	Suite *s = suite_create("envelope");
	TCase *tc = tcase_create("core");

	tcase_add_test(tc, test_pack_request);
	tcase_add_test(tc, test_pack_request_refuses_what_it_does_not_know);
	tcase_add_test(tc, test_unpack_response);
	tcase_add_test(tc, test_unpack_response_falls_back);
	suite_add_tcase(s, tc);
	return run_suite(s);
}

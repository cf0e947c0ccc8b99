/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "envelope.h"

enum { WIRE_VARINT = 0, WIRE_LEN = 2 };
enum { FIELD_ID = 1, FIELD_STATUS = 2, FIELD_MESSAGE = 3 }; /* both envelopes' (mrd.proto) */
#define VARINT_MAX 10

static size_t varint_size(uint64_t v)
{
	size_t n = 1;

	for (; v >= 0x80; v >>= 7)
		n++;
	return n;
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
	size_t n = 0;

	for (; v >= 0x80; v >>= 7)
		p[n++] = (uint8_t)(v | 0x80);
	p[n++] = (uint8_t)v;
	return n;
}

static bool get_varint(const uint8_t **p, const uint8_t *end, uint64_t *ret)
{
	uint64_t v = 0;

	for (unsigned i = 0; i < VARINT_MAX && *p < end; i++) {
		uint8_t b = *(*p)++;

		v |= (uint64_t)(b & 0x7f) << (7 * i);
		if (!(b & 0x80)) {
			*ret = v;
			return true;
		}
	}
	return false;
}

/* The body's member: the oneof's case is its field number. */
static const ProtobufCFieldDescriptor *body_field(const ProtobufCMessageDescriptor *desc,
						  unsigned number)
{
	const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(desc, number);

	return f && (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && f->type == PROTOBUF_C_TYPE_MESSAGE
		       ? f
		       : NULL;
}

int envelope_pack_request(const Mrd__Request *req, uint8_t *buf, size_t cap, size_t *ret_len)
{
	const ProtobufCMessage *body = NULL;
	size_t body_len = 0, need = 0, len = 0;
	uint64_t tag = 0;

	if (req->base.n_unknown_fields)
		return -ENOTSUP;
	if (req->body_case != MRD__REQUEST__BODY__NOT_SET) {
		const ProtobufCFieldDescriptor *f = body_field(&mrd__request__descriptor,
							       (unsigned)req->body_case);

		if (!f)
			return -ENOTSUP;
		body = *(const ProtobufCMessage *const *)((const char *)req + f->offset);
		if (!body)
			return -ENOTSUP;
		body_len = protobuf_c_message_get_packed_size(body);
		tag = (uint64_t)f->id << 3 | WIRE_LEN;
		need = varint_size(tag) + varint_size(body_len) + body_len;
	}
	if (req->id) /* proto3: a zero is not sent */
		need += 1 + varint_size(req->id);
	if (need > cap)
		return -EMSGSIZE;
	if (req->id) {
		buf[len++] = FIELD_ID << 3 | WIRE_VARINT;
		len += put_varint(buf + len, req->id);
	}
	if (body) {
		len += put_varint(buf + len, tag);
		len += put_varint(buf + len, body_len);
		len += protobuf_c_message_pack(body, buf + len);
	}
	*ret_len = len;
	return 0;
}

/* A length-delimited field's bytes; false when they run past the end. */
static bool get_bytes(const uint8_t **p, const uint8_t *end, const uint8_t **ret, size_t *ret_len)
{
	uint64_t n;

	if (!get_varint(p, end, &n) || n > (uint64_t)(end - *p))
		return false;
	*ret = *p;
	*ret_len = (size_t)n;
	*p += n;
	return true;
}

Mrd__Response *envelope_unpack_response(const uint8_t *data, size_t len)
{
	const uint8_t *p = data, *end = data + len;
	const char *no_message;
	Mrd__Response *resp = malloc(sizeof(*resp));

	if (!resp)
		return NULL;
	mrd__response__init(resp);
	no_message = resp->message;
	while (p < end) {
		const ProtobufCFieldDescriptor *f;
		const uint8_t *bytes;
		uint64_t key, v;
		size_t n;

		if (!get_varint(&p, end, &key))
			goto generic;
		if (key == (FIELD_ID << 3 | WIRE_VARINT) && get_varint(&p, end, &v))
			resp->id = v;
		else if (key == (FIELD_STATUS << 3 | WIRE_VARINT) && get_varint(&p, end, &v))
			resp->status = (int32_t)(uint32_t)v; /* as protobuf-c reads an int32 */
		else if (key == (FIELD_MESSAGE << 3 | WIRE_LEN) && resp->message == no_message &&
			 get_bytes(&p, end, &bytes, &n)) {
			char *s = malloc(n + 1);

			if (!s)
				goto generic;
			memcpy(s, bytes, n);
			s[n] = '\0';
			resp->message = s;
		} else if ((key & 7) == WIRE_LEN && key >> 3 <= UINT32_MAX &&
			   resp->body_case == MRD__RESPONSE__BODY__NOT_SET &&
			   (f = body_field(&mrd__response__descriptor, (unsigned)(key >> 3))) &&
			   get_bytes(&p, end, &bytes, &n)) {
			ProtobufCMessage *body = protobuf_c_message_unpack(f->descriptor, NULL, n, bytes);

			if (!body)
				goto generic;
			*(ProtobufCMessage **)((char *)resp + f->offset) = body;
			resp->body_case = (Mrd__Response__BodyCase)f->id;
		} else
			goto generic; /* a field twice, an unknown one, or a malformed one */
	}
	return resp;

generic:
	mrd__response__free_unpacked(resp, NULL);
	return mrd__response__unpack(NULL, len, data);
}

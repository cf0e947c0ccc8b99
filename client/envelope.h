/* SPDX-License-Identifier: MIT */
/* The Request and Response envelopes (an id, a status, a message and one body of many), coded
 * by hand; the body itself goes through protobuf-c. protobuf-c's generic code walks every
 * field of the envelope, the whole oneof, to size, pack, and unpack it: 60% of a Ping's
 * client-side instructions. */
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "mrd.pb-c.h"

/* Packs req into buf exactly as protobuf_c_message_pack would. Returns 0 with *ret_len, or
 * -EMSGSIZE when it needs more than cap bytes, -ENOTSUP when req is not one this code packs
 * (unknown fields, a body that is not set right): pack it the generic way then. */
int envelope_pack_request(const Mrd__Request *req, uint8_t *buf, size_t cap, size_t *ret_len);

/* Unpacks a Response as mrd__response__unpack does, which it falls back to for anything but
 * the plain envelope mrd sends; free it with mrd__response__free_unpacked(resp, NULL). NULL
 * when malformed or out of memory. */
Mrd__Response *envelope_unpack_response(const uint8_t *data, size_t len);

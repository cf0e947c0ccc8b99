/* SPDX-License-Identifier: MIT */
#include <errno.h>
#include <stdlib.h>

#include "memory/buddy.h"

static unsigned order_for(uint32_t n)
{
	unsigned o = 0;

	while ((1u << o) < n)
		o++;
	return o;
}

static void list_push(struct buddy *b, uint32_t page, unsigned order)
{
	b->next[page] = b->heads[order];
	b->prev[page] = BUDDY_NONE;
	if (b->heads[order] != BUDDY_NONE)
		b->prev[b->heads[order]] = page;
	b->heads[order] = page;
	b->head_order[page] = (uint8_t)(order + 1);
}

static void list_remove(struct buddy *b, uint32_t page, unsigned order)
{
	if (b->prev[page] != BUDDY_NONE)
		b->next[b->prev[page]] = b->next[page];
	else
		b->heads[order] = b->next[page];
	if (b->next[page] != BUDDY_NONE)
		b->prev[b->next[page]] = b->prev[page];
	b->head_order[page] = 0;
}

int buddy_init(struct buddy *b, uint32_t n_pages)
{
	*b = (struct buddy){ .n_pages = n_pages };
	if (n_pages == 0 || (n_pages & (n_pages - 1)) || n_pages > (1u << 31))
		return -EINVAL;
	b->max_order = order_for(n_pages);
	for (unsigned o = 0; o < sizeof(b->heads) / sizeof(b->heads[0]); o++)
		b->heads[o] = BUDDY_NONE;
	b->next = malloc(sizeof(uint32_t) * n_pages);
	b->prev = malloc(sizeof(uint32_t) * n_pages);
	b->head_order = calloc(n_pages, 1);
	if (!b->next || !b->prev || !b->head_order) {
		buddy_done(b);
		return -ENOMEM;
	}
	list_push(b, 0, b->max_order);
	b->free_pages = n_pages;
	return 0;
}

int buddy_init_used(struct buddy *b, uint32_t n_pages)
{
	int r = buddy_init(b, n_pages);

	if (r < 0)
		return r;
	list_remove(b, 0, b->max_order);
	b->free_pages = 0;
	return 0;
}

void buddy_done(struct buddy *b)
{
	free(b->next);
	free(b->prev);
	free(b->head_order);
	b->next = b->prev = NULL;
	b->head_order = NULL;
}

/* Frees one aligned block, merging it with its buddy while that is free and whole. */
static void free_block(struct buddy *b, uint32_t page, unsigned order)
{
	while (order < b->max_order) {
		uint32_t buddy = page ^ (1u << order);

		if (b->head_order[buddy] != order + 1)
			break;
		list_remove(b, buddy, order);
		page &= ~(1u << order);
		order++;
	}
	list_push(b, page, order);
}

void buddy_free(struct buddy *b, uint32_t first, uint32_t n)
{
	b->free_pages += n;
	/* Split the run into the largest aligned blocks it holds. */
	while (n > 0) {
		unsigned o = 0;

		while (o < b->max_order && !(first & (1u << o)) && (2u << o) <= n)
			o++;
		free_block(b, first, o);
		first += 1u << o;
		n -= 1u << o;
	}
}

int64_t buddy_alloc(struct buddy *b, uint32_t n, uint32_t align)
{
	unsigned want, o;
	uint32_t page;

	if (n == 0 || n > b->n_pages || align == 0 || (align & (align - 1)) || align > b->n_pages)
		return -EINVAL;
	want = order_for(n > align ? n : align);
	for (o = want; o <= b->max_order && b->heads[o] == BUDDY_NONE; o++)
		;
	if (o > b->max_order)
		return -ENOMEM;

	page = b->heads[o];
	list_remove(b, page, o);
	/* Split down: keep the lower half, free the upper one. */
	while (o > want) {
		o--;
		list_push(b, page + (1u << o), o);
	}
	b->free_pages -= 1u << want;
	/* Give back what the run does not use; alignment holds for the first page. */
	if ((1u << want) > n)
		buddy_free(b, page + n, (1u << want) - n);
	return page;
}

/*
 * A small MD5 (RFC 1321) for the signed login form of JetLinks devices.
 * Written for devicehub; public domain.
 */
#ifndef DEVICEHUB_MD5_H
#define DEVICEHUB_MD5_H

#include <stddef.h>
#include <stdint.h>

struct md5 {
	uint32_t h[4];
	uint64_t len;             /* bytes hashed so far */
	unsigned char buf[64];    /* a partial block */
	size_t n;                 /* bytes in buf */
};

void md5_init(struct md5 *m);
void md5_update(struct md5 *m, const void *data, size_t len);
void md5_final(struct md5 *m, unsigned char out[16]);

#endif

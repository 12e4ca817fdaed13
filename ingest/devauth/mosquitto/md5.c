/*
 * MD5 as RFC 1321 describes it, written for devicehub; public domain.
 * Only the signed login form uses it (JetLinks' `secureId|ms` logins),
 * where MD5 is the device's choice, not ours.
 */
#include <string.h>

#include "md5.h"

/* K[i] = floor(|sin(i + 1)| * 2^32) */
static const uint32_t K[64] = {
	0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee,
	0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
	0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be,
	0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
	0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa,
	0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
	0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed,
	0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
	0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c,
	0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
	0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05,
	0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
	0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039,
	0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
	0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1,
	0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391,
};

/* Left-rotation amounts, four per round. */
static const unsigned char S[16] = {
	7, 12, 17, 22, 5, 9, 14, 20, 4, 11, 16, 23, 6, 10, 15, 21,
};

static uint32_t rotl(uint32_t x, unsigned n) { return (x << n) | (x >> (32 - n)); }

static void block(uint32_t h[4], const unsigned char *p)
{
	uint32_t w[16], a = h[0], b = h[1], c = h[2], d = h[3];
	for (int i = 0; i < 16; i++) {
		w[i] = (uint32_t)p[4 * i] | (uint32_t)p[4 * i + 1] << 8 |
		       (uint32_t)p[4 * i + 2] << 16 | (uint32_t)p[4 * i + 3] << 24;
	}
	for (int i = 0; i < 64; i++) {
		uint32_t f;
		int g;
		switch (i / 16) {
		case 0: f = (b & c) | (~b & d); g = i; break;
		case 1: f = (d & b) | (~d & c); g = (5 * i + 1) % 16; break;
		case 2: f = b ^ c ^ d; g = (3 * i + 5) % 16; break;
		default: f = c ^ (b | ~d); g = (7 * i) % 16; break;
		}
		f += a + K[i] + w[g];
		a = d;
		d = c;
		c = b;
		b += rotl(f, S[(i / 16) * 4 + i % 4]);
	}
	h[0] += a;
	h[1] += b;
	h[2] += c;
	h[3] += d;
}

void md5_init(struct md5 *m)
{
	m->h[0] = 0x67452301;
	m->h[1] = 0xefcdab89;
	m->h[2] = 0x98badcfe;
	m->h[3] = 0x10325476;
	m->len = 0;
	m->n = 0;
}

void md5_update(struct md5 *m, const void *data, size_t len)
{
	const unsigned char *p = data;
	m->len += len;
	if (m->n > 0) {
		size_t take = 64 - m->n < len ? 64 - m->n : len;
		memcpy(m->buf + m->n, p, take);
		m->n += take;
		p += take;
		len -= take;
		if (m->n < 64) return;
		block(m->h, m->buf);
		m->n = 0;
	}
	for (; len >= 64; p += 64, len -= 64) block(m->h, p);
	memcpy(m->buf, p, len);
	m->n = len;
}

void md5_final(struct md5 *m, unsigned char out[16])
{
	uint64_t bits = m->len * 8;
	unsigned char pad[72] = {0x80};
	size_t padlen = (m->n < 56 ? 56 : 120) - m->n;
	for (int i = 0; i < 8; i++) pad[padlen + i] = (unsigned char)(bits >> (8 * i));
	md5_update(m, pad, padlen + 8);
	for (int i = 0; i < 4; i++) {
		out[4 * i] = (unsigned char)m->h[i];
		out[4 * i + 1] = (unsigned char)(m->h[i] >> 8);
		out[4 * i + 2] = (unsigned char)(m->h[i] >> 16);
		out[4 * i + 3] = (unsigned char)(m->h[i] >> 24);
	}
}

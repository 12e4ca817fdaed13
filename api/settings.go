package api

import (
	"devicehub/schema/jsonw"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"
)

// settings is GET /api/settings: what a client needs to read the
// platform's answers right, for any signed-in caller: the time zone that
// dashboard buckets, their timeString and history's timeString follow
// (DEVICEHUB_TIMEZONE) and its offset from UTC now, in seconds.
func (s *Server) settings(c *fiber.Ctx) error {
	loc := time.Local
	if s.deps.Dashboard != nil {
		loc = s.deps.Dashboard.Location()
	}
	now := time.Now().In(loc)
	abbr, offset := now.Zone()
	return okWith(c, func(b []byte) []byte {
		b = append(b, `{"timeZone":`...)
		b = jsonw.String(b, loc.String())
		b = append(b, `,"timeZoneAbbreviation":`...)
		b = jsonw.String(b, abbr)
		b = append(b, `,"utcOffsetSeconds":`...)
		b = strconv.AppendInt(b, int64(offset), 10)
		return append(b, '}')
	})
}

package api

import "time"

// SetDashboardClock fixes the "now" of endpoint 14's and exports' date
// math in the servers built with o: a hook for api_test's golden set,
// which no server outside the tests needs.
func SetDashboardClock(o *Options, now func() time.Time) { o.dashboardClock = now }

package remotetier

import "time"

// SetWarnClock makes r's Warn lines read their time from now (the tests'
// clock). The tests live in package remotetier_test: they build caches
// with internal/stacktest, whose kvtier/stack imports this package.
func (r *Tier) SetWarnClock(now func() time.Time) { r.warn.now = now }

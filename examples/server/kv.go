package main

import (
	"kvtier.dev/examples/server/internal/httpapi"
)

// kvRoutes configures the API's /v1/kv routes over the cache, or none
// without one (-strategy none).
func kvRoutes(p *parts, s shape) *httpapi.KV {
	if p.cache == nil {
		return nil
	}
	bt := s.model.BlockTokens
	// The engine looks up the full blocks before the one holding the
	// prompt's last position, which it always computes (engine.attempt).
	return &httpapi.KV{Manager: p.cache.Manager, LookupTokens: func(n int) int { return (n - 1) / bt * bt }}
}

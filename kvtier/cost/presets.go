package cost

// Presets names what NewPlannerConfig builds a PlannerConfig from.
type Presets struct {
	Model, GPU             string // "llama-3.1-8b", "h200"
	HostLink               string // the ingress every load crosses: "pcie5-pinned"
	NVMe                   string // the drives, "nvme-gen4-x4"; "": no NVMe path
	TP                     int    // 0 means 1
	BlockTokens, MaxBlocks int    // see PlannerConfig
}

// NewPlannerConfig builds a PlannerConfig from preset names; the NVMe and
// remote (rdma-400g) paths pipeline into the host link.
func NewPlannerConfig(ps Presets) (PlannerConfig, error) {
	m, err := LookupModel(ps.Model)
	if err != nil {
		return PlannerConfig{}, err
	}
	g, err := LookupGPU(ps.GPU)
	if err != nil {
		return PlannerConfig{}, err
	}
	host, err := LookupLink(ps.HostLink)
	if err != nil {
		return PlannerConfig{}, err
	}
	rdma, err := LookupLink("rdma-400g")
	if err != nil {
		return PlannerConfig{}, err
	}
	tp := ps.TP
	if tp == 0 {
		tp = 1
	}
	cfg := PlannerConfig{Model: m, GPU: g, TP: tp, BlockTokens: ps.BlockTokens, MaxBlocks: ps.MaxBlocks}
	cfg.Paths[TierHost] = DirectPath(host)
	cfg.Paths[TierRemote] = Path{Source: rdma, Ingress: host, Pipelined: true}
	if ps.NVMe != "" {
		drive, err := LookupLink(ps.NVMe)
		if err != nil {
			return PlannerConfig{}, err
		}
		cfg.Paths[TierNVMe] = Path{Source: drive, Ingress: host, Pipelined: true}
	}
	return cfg, nil
}

// SetIngress makes l (Probe.Pinned, say) every path's GPU link.
func (c *PlannerConfig) SetIngress(l Link) {
	for t := range c.Paths {
		if c.Paths[t] != (Path{}) {
			c.Paths[t].Ingress = l
		}
	}
}

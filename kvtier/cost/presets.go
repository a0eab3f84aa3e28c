package cost

// Presets names what NewPlannerConfig builds a PlannerConfig from.
type Presets struct {
	// Model and GPU are preset names, e.g. "llama-3.1-8b" and "h200".
	Model, GPU string
	// HostLink is the GPU's host link, the ingress every load crosses:
	// "pcie5-pinned", "nvlink-c2c-gh200".
	HostLink string
	// NVMe is the drives' preset ("nvme-gen5", "nvme-gen4-x4"); "" leaves
	// the NVMe tier without a path.
	NVMe string
	// TP is the tensor-parallel degree (0 means 1; NewPlanner refuses a
	// negative one).
	TP int
	// BlockTokens and MaxBlocks: see PlannerConfig.
	BlockTokens, MaxBlocks int
}

// NewPlannerConfig builds a PlannerConfig from preset names. Host blocks
// load over the host link, NVMe blocks over the drives then the host link,
// pipelined, and remote blocks over rdma-400g then the host link. Adjust
// any field before NewPlanner; SetIngress swaps in a measured host link.
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

// SetIngress makes l the GPU link of every tier that has a path: use it with
// Probe.Pinned so that measured figures replace the preset.
func (c *PlannerConfig) SetIngress(l Link) {
	for t := range c.Paths {
		if c.Paths[t] != (Path{}) {
			c.Paths[t].Ingress = l
		}
	}
}

package agent

import (
	"context"
	"errors"
	"time"

	"github.com/kubenet-dev/kubenet/agent/cri"
	"github.com/kubenet-dev/kubenet/agent/loop"
	"github.com/kubenet-dev/kubenet/agent/stale"
	"github.com/kubenet-dev/kubenet/core"
)

// runtimeTimeout bounds one question to the runtime.
const runtimeTimeout = 30 * time.Second

// newCollector prepares the stale-attachment collection against the configured runtime.
func (a *Agent) newCollector() (*stale.Collector, func(), error) {
	client, err := cri.Dial(a.cfg.RuntimeEndpoint)
	if err != nil {
		return nil, nil, err
	}
	c, err := stale.New(client, a.cfg.StaleGrace, core.Collect)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return c, func() { client.Close() }, nil
}

// staleLoop runs a collection pass every StaleInterval. Passes start once the conflist is
// written: before that no pod can have been attached through it.
func (a *Agent) staleLoop(c *stale.Collector) *loop.Loop {
	return loop.New(loop.Config{Period: a.cfg.StaleInterval, Pass: func(ctx context.Context, _ loop.Wake) loop.Outcome {
		a.mu.Lock()
		network := a.network
		a.mu.Unlock()
		if network != nil {
			a.stalePass(ctx, c, network)
		}
		return loop.Outcome{}
	}})
}

func (a *Agent) stalePass(ctx context.Context, c *stale.Collector, network *core.Config) {
	pctx, cancel := context.WithTimeout(ctx, runtimeTimeout)
	defer cancel()
	res, err := c.Pass(pctx, network)
	for _, rec := range res.Report.Attachments {
		a.log.Info("collected the attachment of a sandbox the runtime no longer lists",
			"container", rec.ContainerID, "ifname", rec.IfName, "pod", rec.Pod, "ips", rec.IPs)
	}
	for _, addr := range res.Report.Addresses {
		a.log.Info("released a reservation without a sandbox or record", "ip", addr)
	}
	a.metrics.staleCollected.WithLabelValues("attachment").Add(float64(len(res.Report.Attachments)))
	a.metrics.staleCollected.WithLabelValues("reservation").Add(float64(len(res.Report.Addresses)))
	switch {
	case errors.Is(err, stale.ErrRuntimeUnavailable):
		a.metrics.stalePasses.WithLabelValues("runtime_unavailable").Inc()
		a.log.Warn("stale attachments not collected", "err", err)
	case err != nil:
		a.metrics.stalePasses.WithLabelValues("error").Inc()
		a.log.Error("stale attachments collected in part", "err", err)
	default:
		a.metrics.stalePasses.WithLabelValues("ok").Inc()
		a.log.Debug("stale attachments pass", "sandboxes", res.Sandboxes, "unlisted", res.Unlisted,
			"collected", len(res.Report.Attachments), "released", len(res.Report.Addresses))
	}
}

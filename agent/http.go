package agent

import (
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves /healthz (the sync loop is alive: no sync has been stuck for stuckAfter; an
// agent still waiting for the API server is healthy, restarting it would not help), /readyz (the conflist for the node's pod CIDRs is written; the body
// says why not) and /metrics.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		a.mu.Lock()
		inSync := a.inSync
		a.mu.Unlock()
		if !inSync.IsZero() && time.Since(inSync) > stuckAfter {
			http.Error(w, fmt.Sprintf("a sync has been running since %s", inSync.Format(time.RFC3339)), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		a.mu.Lock()
		ready, why := a.ready, a.notReady
		a.mu.Unlock()
		if !ready {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("/metrics", promhttp.HandlerFor(a.cfg.Registry, promhttp.HandlerOpts{Registry: a.cfg.Registry}))
	return mux
}

package agent

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves /healthz (the sync loop is alive: no sync has been stuck for stuckAfter; an
// agent still waiting for the API server is healthy, restarting it would not help), /readyz (the conflist for the node's pod CIDRs is written; the body
// says why not), /peers (how each other node's pod CIDRs are reached, and why: JSON, what
// `kubenetctl peers` prints) and /metrics.
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
	mux.HandleFunc("/peers", func(w http.ResponseWriter, _ *http.Request) {
		a.mu.Lock()
		paths := a.paths
		a.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(paths); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	})
	mux.Handle("/metrics", promhttp.HandlerFor(a.cfg.Registry, promhttp.HandlerOpts{Registry: a.cfg.Registry}))
	return mux
}

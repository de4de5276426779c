package authz

import (
	"encoding/json"
	"log/slog"
	"net/http"
)

// maxInFlight bounds decisions a Handler serves at once; beyond, it
// answers 503 at once rather than queue without bound.
const maxInFlight = 256

// Handler serves the decision protocol (POST DecidePath) and GET /healthz
// (200 once an inventory is loaded) for e. Every decision is logged
// with its outcome and reason.
func Handler(e *Engine, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	slots := make(chan struct{}, maxInFlight)
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+DecidePath, func(w http.ResponseWriter, r *http.Request) {
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		default:
			http.Error(w, "too many decisions in flight; retry", http.StatusServiceUnavailable)
			return
		}
		serveDecision(e, log, w, r)
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if e.Snapshot() == nil {
			http.Error(w, "no inventory loaded yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return mux
}

func serveDecision(e *Engine, log *slog.Logger, w http.ResponseWriter, r *http.Request) {
	req, err := DecodeRequest(http.MaxBytesReader(w, r.Body, MaxMessageBytes))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := e.Decide(req)
	switch {
	case ErrNoInventory(err):
		http.Error(w, "no inventory loaded yet; retry", http.StatusServiceUnavailable)
		return
	case err != nil:
		log.Error("decision failed", "peer", req.Peer, "error", err)
		http.Error(w, "decision failed: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	log.Info("decision", "peer", req.Peer, "dns_names", req.DNSNames, "ip_addresses", req.IPAddresses,
		"csr_sha256", req.CSRSHA256, "outcome", resp.Outcome, "machine", resp.Machine, "reason", resp.Reason)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

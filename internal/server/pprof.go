package server

import (
	"net/http"
	"net/http/pprof"
)

// pprofMux serves Go's profiles, without /debug/pprof/cmdline: the command
// line may carry a secret passed as a flag. Nothing here reads the
// environment.
func pprofMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index) // the index and the named runtime profiles
	mux.HandleFunc("/debug/pprof/cmdline", http.NotFound)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// Package server serves files.
package server

import (
	"fmt"
	"net/http"
)

// Server holds the listener settings.
type Server struct {
	Addr string
	Root string
}

// NewServer returns a Server for addr.
func NewServer(addr string) *Server {
	return &Server{Addr: addr, Root: "."}
}

// Handle answers one request.
func (s *Server) Handle(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/" {
		fmt.Fprintf(w, "root {%s}", s.Root)
		return
	}
	http.NotFound(w, r)
}

func (s Server) String() string {
	return fmt.Sprintf("server at %s", s.Addr)
}

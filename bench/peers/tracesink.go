package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
)

// traceSink is the OTLP/HTTP endpoint the @trace<R> systems' nodes export
// their spans to: it reads every export request whole and answers it as a
// collector does (an empty ExportTraceServiceResponse), counting what it
// got, so that the nodes pay the full cost of exporting and nothing
// outside this run is involved.
type traceSink struct {
	url             string
	requests, bytes atomic.Int64
}

// traceSink starts the lab's sink on first use and returns its base URL.
func (l *lab) traceSink() (string, error) {
	if l.sink != nil {
		return l.sink.url, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("trace sink: %w", err)
	}
	s := &traceSink{url: "http://" + ln.Addr().String()}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		s.requests.Add(1)
		s.bytes.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK) // an empty message: zero bytes of protobuf
	})}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			l.logf("trace sink: %v", err)
		}
	}()
	l.sink = s
	return s.url, nil
}

// writeTraceSink says how much the traced systems exported.
func writeTraceSink(w io.Writer, s *traceSink) {
	if s == nil {
		return
	}
	fmt.Fprintf(w, "\nOTLP trace sink: %d export requests, %d bytes from the @trace systems' nodes\n", s.requests.Load(), s.bytes.Load())
}

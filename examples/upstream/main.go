// Command upstream is a toy payments API for the proxy walkthrough of docs/getting-started.md:
// every POST /payments "charges" once and says how many charges it has made,
// so a replay is easy to tell from a second execution. A request with
// ?slow=1 takes five seconds (time to send a concurrent retry).
//
//	go run ./examples/upstream   # listens on 127.0.0.1:9000
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"sync/atomic"
	"time"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9000", "`HOST:PORT` to listen on")
	flag.Parse()
	var charges atomic.Int64
	http.HandleFunc("POST /payments", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Query().Get("slow") == "1" {
			time.Sleep(5 * time.Second)
		}
		n := charges.Add(1)
		log.Printf("charging %s (key %s, fencing token %s): charge #%d", body, r.Header.Get("Idempotency-Key"), r.Header.Get("Idempotency-Fencing-Token"), n)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "{\"charge_id\":\"ch_%d\",\"charges_so_far\":%d}\n", n, n)
	})
	http.HandleFunc("GET /payments", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "{\"charges_so_far\":%d}\n", charges.Load())
	})
	log.Printf("toy payments API on %s", *addr)
	log.Fatal(http.ListenAndServe(*addr, nil))
}

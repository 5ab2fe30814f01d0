// Command goservice is the "Use idem inside a Go service" example of docs/getting-started.md,
// runnable as written against a dev node (go run ./cmd/idemnode --dev):
//
//	go run ./examples/goservice
//
// It shows the three in-process ways to use idem: net/http middleware in
// front of a handler, Do around one operation, and Once in a queue consumer
// that is handed every event three times.
package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/client"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(client.DefaultConfig("127.0.0.1:7070")) // the dev node's gRPC address
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// 1. Middleware: a payments handler that must charge once per Idempotency-Key.
	var charges atomic.Int32
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, _ := client.FencingToken(r.Context()) // hand it to your own storage
		n := charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":"ch_%d","fencing_token":"%d"}`, n, token) // a string: JSON numbers lose 64-bit precision in JavaScript
	})
	srv := httptest.NewServer(client.Middleware(c, client.RequireKey())(pay))
	defer srv.Close()
	key := client.NewKey()
	for attempt := 1; attempt <= 3; attempt++ { // a client retrying the same request
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":100}`))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("middleware attempt %d: %d replayed=%q %s\n", attempt, resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), body)
	}
	fmt.Printf("middleware: the handler charged %d time(s)\n\n", charges.Load())

	// 2. Do: run one operation once, replaying its stored response to retries.
	opKey := client.NewKey()
	for attempt := 1; attempt <= 2; attempt++ {
		res, err := c.Do(ctx, "billing", opKey, func(ctx context.Context, l client.Lease) (client.Response, error) {
			return client.Response{Status: 200, Body: []byte(fmt.Sprintf("invoice sent (fencing token %d)", l.FencingToken))}, nil
		})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("Do attempt %d: replayed=%v %s\n", attempt, res.Replayed, res.Response.Body)
	}
	fmt.Println()

	// 3. Once: a consumer that is handed every event three times, concurrently.
	var ran sync.Map
	var wg sync.WaitGroup
	events := []string{client.NewKey(), client.NewKey(), client.NewKey()}
	for delivery := 0; delivery < 3; delivery++ {
		for _, ev := range events {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := c.Once(ctx, "consumers", ev, func(ctx context.Context, fencingToken uint64) error {
					n, _ := ran.LoadOrStore(ev, new(atomic.Int32))
					n.(*atomic.Int32).Add(1)
					return nil
				})
				if err != nil {
					log.Print(err)
				}
			}()
		}
	}
	wg.Wait()
	for _, ev := range events {
		n, _ := ran.Load(ev)
		fmt.Printf("Once: event %s delivered 3 times, processed %d time(s)\n", ev, n.(*atomic.Int32).Load())
	}
}

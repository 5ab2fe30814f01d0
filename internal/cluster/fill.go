package cluster

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/client"
)

// Filler runs reserve+complete cycles of fresh keys through a client, for
// the fill benchmarks: Workers concurrent writers, each cycle storing a
// 512-byte body drawn from 1 MiB of random bytes (a different slice per
// cycle, so the engine's compression does not fold them).
type Filler struct {
	Client    *client.Client
	Namespace string
	Workers   int           // 0: 64
	Retention time.Duration // 0: 24 h

	pool []byte
	next atomic.Int64
}

// Done is how many cycles the Filler has completed.
func (f *Filler) Done() int64 { return f.next.Load() }

// Run does n more cycles and returns the first error; keys are "k-<i>"
// with i counting on from the last Run.
func (f *Filler) Run(ctx context.Context, n int) error {
	if f.pool == nil {
		f.pool = make([]byte, 1<<20)
		for i := range f.pool {
			f.pool[i] = byte(rand.IntN(256))
		}
	}
	workers, retention := cmp.Or(f.Workers, 64), cmp.Or(f.Retention, 24*time.Hour)
	end := f.next.Load() + int64(n)
	var wg sync.WaitGroup
	var failed atomic.Value
	for range workers {
		wg.Go(func() {
			for failed.Load() == nil {
				i := f.next.Add(1)
				if i > end {
					return
				}
				key := "k-" + strconv.FormatInt(i, 10)
				off := int(i*4099) % (len(f.pool) - 512)
				r, err := f.Client.Reserve(ctx, client.ReserveRequest{Namespace: f.Namespace, Key: key})
				if err == nil {
					_, err = f.Client.Complete(ctx, client.CompleteRequest{Namespace: f.Namespace, Key: key, OwnerToken: r.OwnerToken,
						Response: client.Response{Status: 201, Body: f.pool[off : off+512]}, Retention: retention})
				}
				if err != nil {
					failed.Store(fmt.Errorf("cluster: fill cycle %d: %w", i, err))
				}
			}
		})
	}
	wg.Wait()
	f.next.Store(end)
	err, _ := failed.Load().(error)
	return err
}

// MetricSum scrapes http://httpAddr/metrics and sums the samples of name
// (every label set).
func MetricSum(ctx context.Context, httpAddr, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	return sumMetric(resp.Body, name)
}

// MetricSum is the package's MetricSum over a's scheme and credentials (a
// secure node's /metrics).
func (a *API) MetricSum(ctx context.Context, name string) (float64, error) {
	r, err := a.Do(ctx, http.MethodGet, "/metrics", nil)
	if err != nil {
		return 0, err
	}
	if r.Status != http.StatusOK {
		return 0, fmt.Errorf("cluster: GET %s/metrics: %s", a.Base, r)
	}
	return sumMetric(bytes.NewReader(r.Raw), name)
}

// sumMetric sums the samples of name in the Prometheus text of r.
func sumMetric(r io.Reader, name string) (float64, error) {
	var sum float64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			return 0, fmt.Errorf("cluster: metric line %q: %w", line, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

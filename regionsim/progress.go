package regionsim

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progress prints the live progress line: on a terminal rewritten in place
// every half second, otherwise a line every five seconds.
type progress struct {
	w       io.Writer
	inPlace bool
	mu      sync.Mutex
	dirty   bool // an in-place line is on screen
}

func newProgress(w io.Writer, inPlace bool) *progress { return &progress{w: w, inPlace: inPlace} }

// say prints a line of its own.
func (p *progress) say(msg string) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
	fmt.Fprintln(p.w, "regionsim: "+msg)
}

func (p *progress) clearLocked() {
	if p.dirty {
		fmt.Fprint(p.w, "\r\033[K")
		p.dirty = false
	}
}

func (p *progress) line(msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inPlace {
		fmt.Fprint(p.w, "\r\033[K"+msg)
		p.dirty = true
		return
	}
	fmt.Fprintln(p.w, msg)
}

func (p *progress) close() {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clearLocked()
}

// track shows r's progress until the returned stop is called.
func (p *progress) track(r *scenarioRun, idx, total int) (stop func()) {
	if p.w == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		every := 5 * time.Second
		if p.inPlace {
			every = 500 * time.Millisecond
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				p.line(r.status(idx, total))
			}
		}
	}()
	return func() {
		close(done)
		wg.Wait()
		p.mu.Lock()
		p.clearLocked()
		p.mu.Unlock()
	}
}

// status is the one-line state of a scenario in progress.
func (r *scenarioRun) status(idx, total int) string {
	elapsed := time.Since(r.start)
	phase := "load"
	if time.Now().After(r.loadEnd()) {
		phase = "drain"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "[%d/%d %s] %s %4.1fs/%.0fs", idx+1, total, r.sc.Name, phase, elapsed.Seconds(), r.loadEnd().Sub(r.start).Seconds())
	for _, name := range []string{sysIdem, sysNaive} {
		r.mu.Lock()
		res, ok := r.results[name]
		r.mu.Unlock()
		if ok {
			short := strings.Fields(name)[0]
			fmt.Fprintf(&b, " | %s ok %d err %d", short, res.ok.Load(), res.failed.Load())
		}
	}
	fmt.Fprintf(&b, " | ops %d", r.rec.Len())
	if active := r.activeFaults(); len(active) > 0 {
		fmt.Fprintf(&b, " | faults: %s", strings.Join(active, "; "))
	} else {
		b.WriteString(" | faults: none")
	}
	if down := r.c.down(); len(down) > 0 {
		fmt.Fprintf(&b, " | down: %s", strings.Join(down, " "))
	}
	if cuts := r.c.net.ActiveCuts(); len(cuts) > 0 {
		fmt.Fprintf(&b, " | cuts: %s", strings.Join(cuts, ", "))
	}
	s := b.String()
	if r.cfg.ProgressInPlace && len(s) > 200 {
		s = s[:197] + "..."
	}
	return s
}

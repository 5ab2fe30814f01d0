package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// idem's JSON client sends each complete to the Idem-Leader its reserve
// answer named, and round-robin without --json-follow-leader.
func TestIdemJSONFollowsLeaderHint(t *testing.T) {
	var completes [2]atomic.Int64
	var addrs []string
	for i := range completes {
		hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, ":reserve") {
				w.Header().Set("Idem-Leader", addrs[1])
				_, _ = w.Write([]byte(`{"outcome":"ACQUIRED"}`))
				return
			}
			completes[i].Add(1)
			_, _ = w.Write([]byte(`{}`))
		}))
		t.Cleanup(hs.Close)
		addrs = append(addrs, strings.TrimPrefix(hs.URL, "http://"))
	}
	for _, follow := range []bool{true, false} {
		completes[0].Store(0)
		completes[1].Store(0)
		j := newIdemJSON(addrs, []byte("body"), 4, 10*time.Second, follow)
		for i := range 6 {
			key := "k" + string(rune('a'+i))
			if err := cycle(t.Context(), j, key, "owner-0123456789abcdef"); err != nil {
				t.Fatal(err)
			}
		}
		j.close()
		c0, c1 := completes[0].Load(), completes[1].Load()
		// Round-robin alternates reserve and complete over the two
		// addresses, so every complete lands on the one not named.
		if follow && (c0 != 0 || c1 != 6) || !follow && (c0 != 6 || c1 != 0) {
			t.Errorf("follow %v: completes %d and %d", follow, c0, c1)
		}
	}
}

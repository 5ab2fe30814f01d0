package console

import (
	"crypto/tls"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestNextRetry(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	completed := record{State: "COMPLETED", Fingerprint: "fp", FencingToken: "7", CompletedAt: "2026-03-01T11:00:00Z", ExpiresAt: "2026-03-02T11:00:00Z"}
	completed.Response = &struct {
		Status  int               `json:"status"`
		Headers map[string]string `json:"headers"`
		Body    string            `json:"body"`
	}{Status: 201}
	for _, tc := range []struct {
		name  string
		rec   record
		found bool
		want  []string
	}{
		{"absent", record{}, false, []string{"gets ACQUIRED"}},
		{"completed", completed, true, []string{"A retry with the same fingerprint replays the 201 stored at 2026-03-01 11:00:00 UTC", "another fingerprint gets FINGERPRINT_MISMATCH"}},
		{"leased", record{State: "IN_PROGRESS", Fingerprint: "fp", FencingToken: "9", LeaseExpiresAt: "2026-03-01T12:00:30Z"}, true,
			[]string{"gets IN_PROGRESS, to retry in about 30s", "fencing token 9", "RECLAIMS"}},
		{"lease ended", record{State: "IN_PROGRESS", FencingToken: "9", LeaseExpiresAt: "2026-03-01T11:59:00Z"}, true,
			[]string{"The lease ended", "RECLAIMS the key with a fencing token larger than 9", "NOT_OWNER", "a retry that sends a fingerprint gets FINGERPRINT_MISMATCH"}},
		{"tombstone", record{State: "EXPIRED", Fingerprint: "fp", ExpiredAt: "2026-03-01T10:00:00Z"}, true, []string{"gets EXPIRED"}},
	} {
		got := nextRetry(tc.rec, tc.found, now)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", tc.name, got, w)
			}
		}
	}
}

func TestMakePreview(t *testing.T) {
	if p := makePreview(nil); p.Kind != "empty" {
		t.Errorf("empty body: %+v", p)
	}
	if p := makePreview([]byte("<b>hi</b>\n")); p.Kind != "text" || p.Text != "<b>hi</b>\n" || p.Truncated {
		t.Errorf("text body: %+v", p)
	}
	if p := makePreview([]byte{0x00, 0xff, 'a'}); p.Kind != "hex" || !strings.Contains(p.Text, "00 ff 61") {
		t.Errorf("binary body: %+v", p)
	}
	long := strings.Repeat("é", previewBytes) // two bytes each: the cut falls inside none
	if p := makePreview([]byte(long)); p.Kind != "text" || !p.Truncated || len(p.Text) > previewBytes || !strings.HasSuffix(p.Text, "é") {
		t.Errorf("long body: kind %s, %d bytes, truncated %v", p.Kind, len(p.Text), p.Truncated)
	}
}

func TestSummarize(t *testing.T) {
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var doc topologyDoc
	doc.ActiveVersion, doc.TargetVersion = 1, 2
	doc.Progress = &topologyProgress{ShardsDone: 2, ShardsTotal: 2, PartitionsTotal: 100, PartitionsMoved: 25, StartedAt: start, Waiting: "cluster version 2 < 3"}
	p := summarize(doc, start.Add(10*time.Second))
	if !p.Running || p.Percent != 40 || p.Remaining != "about 30s" || !strings.Contains(p.Step, "25 of 100") || p.WaitingFor != "cluster version 2 < 3" {
		t.Errorf("running change: %+v", p)
	}
	doc.TargetVersion, doc.Progress = 0, nil
	if p := summarize(doc, start); p.Running || p.Percent != 100 || !strings.Contains(p.Step, "version 1 is in force") {
		t.Errorf("no change: %+v", p)
	}
	if got := percent(1, 2, 0, 0); got != 50 {
		t.Errorf("percent of a change that moves no partitions: %d", got)
	}
}

func TestChangeLogRecordsAFinishedChange(t *testing.T) {
	var l changeLog
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	l.observe(Progress{Running: true, ActiveVersion: 1, TargetVersion: 2, StartedAt: now.Format(time.RFC3339)}, now)
	got := l.observe(Progress{ActiveVersion: 2}, now.Add(7*time.Second))
	if len(got) != 1 || got[0].From != 1 || got[0].To != 2 || got[0].Took != "7s" {
		t.Fatalf("changes: %+v", got)
	}
}

func TestQuantile(t *testing.T) {
	prev := sample{buckets: map[float64]float64{0.01: 0, 0.1: 0}}
	cur := sample{buckets: map[float64]float64{0.01: 50, 0.1: 100}, count: 100}
	if q := quantile(0.5, prev, cur); q == nil || *q != 0.01 {
		t.Errorf("p50: %v", q)
	}
	if q := quantile(0.9, prev, cur); q == nil || *q < 0.08 || *q > 0.083 {
		t.Errorf("p90: %v, want 0.082 (linear within the bucket)", *q)
	}
	if q := quantile(0.5, cur, cur); q != nil {
		t.Errorf("no requests: %v", *q)
	}
}

func TestSameOrigin(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tls     bool
		headers map[string]string
		want    bool
	}{
		{"origin", true, map[string]string{"Origin": "https://node:8080"}, true},
		{"origin over http", false, map[string]string{"Origin": "http://node:8080"}, true},
		{"other origin", true, map[string]string{"Origin": "https://evil:8080"}, false},
		{"scheme differs", true, map[string]string{"Origin": "http://node:8080"}, false},
		{"referer", true, map[string]string{"Referer": "https://node:8080/ui/stuck"}, true},
		{"other referer", true, map[string]string{"Referer": "https://evil/ui/stuck"}, false},
		{"neither", true, nil, false},
		{"cross-site fetch", true, map[string]string{"Origin": "https://node:8080", "Sec-Fetch-Site": "cross-site"}, false},
	} {
		r := &http.Request{Host: "node:8080", Header: http.Header{}}
		if tc.tls {
			r.TLS = &tls.ConnectionState{}
		}
		for k, v := range tc.headers {
			r.Header.Set(k, v)
		}
		if got := sameOrigin(r); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestFlashSaysOnlyWhatItBuilds(t *testing.T) {
	ok := url.Values{"done": {"released"}, "ns": {"payments"}, "key": {"k-1"}, "prev": {"42"}}
	if got := flash(ok); !strings.Contains(got, "payments/k-1 was force-released") || !strings.Contains(got, "42") {
		t.Errorf("flash %q", got)
	}
	for _, bad := range []url.Values{
		{"done": {"released"}, "ns": {"payments"}, "key": {"k"}, "prev": {"call support at 555"}},
		{"done": {"released"}, "ns": {"Pay ments"}, "key": {"k"}, "prev": {"1"}},
		{"done": {"anything"}, "ns": {"payments"}},
		{"flash": {"Your account is locked"}},
	} {
		if got := flash(bad); got != "" {
			t.Errorf("flash(%v) = %q, want none", bad, got)
		}
	}
}

func TestWhen(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	if got := when("2026-03-01T12:00:25.4Z", now); got != "2026-03-01 12:00:25 UTC (in 25s)" {
		t.Errorf("future: %q", got)
	}
	if got := when("2026-03-01T11:57:00Z", now); got != "2026-03-01 11:57:00 UTC (3m0s ago)" {
		t.Errorf("past: %q", got)
	}
}

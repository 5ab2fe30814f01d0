package server

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// oneByteReader hands out its data a byte at a time, like a slow client.
type oneByteReader struct{ r io.Reader }

func (o oneByteReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	return o.r.Read(p[:1])
}

// readAllLimited reads whole bodies whatever their declared length says,
// and refuses one past the limit.
func TestReadAllLimited(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789"), 80)
	big := bytes.Repeat([]byte("0123456789"), readAhead/10+100)
	cases := []struct {
		name     string
		declared int64 // ContentLength; -1 unknown
		reader   io.Reader
		limit    int64
		want     []byte
		tooLarge bool
	}{
		{"declared length", int64(len(body)), bytes.NewReader(body), 1 << 20, body, false},
		{"declared length, a byte at a time", int64(len(body)), oneByteReader{bytes.NewReader(body)}, 1 << 20, body, false},
		{"empty", 0, strings.NewReader(""), 1 << 20, []byte{}, false},
		{"unknown length", -1, bytes.NewReader(body), 1 << 20, body, false},
		{"more than declared", 10, bytes.NewReader(body), 1 << 20, body, false},
		{"fewer than declared", 2000, bytes.NewReader(body), 1 << 20, body, false},
		{"unknown length past the limit", -1, bytes.NewReader(body), 100, nil, true},
		{"more than declared, past the limit", 10, bytes.NewReader(body), 100, nil, true},
		{"exactly the limit", int64(len(body)), bytes.NewReader(body), int64(len(body)), body, false},
		{"declared past what is read ahead", int64(len(big)), oneByteReader{bytes.NewReader(big)}, 1 << 20, big, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/", nil)
			r.Body = io.NopCloser(c.reader)
			r.ContentLength = c.declared
			got, err := readAllLimited(httptest.NewRecorder(), r, c.limit)
			if c.tooLarge {
				var maxErr *http.MaxBytesError
				if !errors.As(err, &maxErr) {
					t.Fatalf("err = %v, want *http.MaxBytesError", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, c.want) {
				t.Fatalf("read %d bytes, want %d", len(got), len(c.want))
			}
		})
	}
}

// A body that declares more than it sends does not get its declared
// length allocated up front.
func TestReadAllLimitedReadsAheadBounded(t *testing.T) {
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Body = io.NopCloser(strings.NewReader("{}"))
	r.ContentLength = 8 << 20
	got, err := readAllLimited(httptest.NewRecorder(), r, 16<<20)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "{}" || cap(got) > readAhead+1 {
		t.Fatalf("read %q into a buffer of %d bytes; want \"{}\" in at most %d", got, cap(got), readAhead+1)
	}
}

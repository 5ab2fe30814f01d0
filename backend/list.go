package backend

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/idem-dev/idem/contract"
	"github.com/idem-dev/idem/fsm"
)

// Limits of a key listing (docs/api.md, "Operator actions").
const (
	// DefaultListLimit is the page size of a listing that names none.
	DefaultListLimit = 100
	// MaxListLimit is the largest page a listing may ask for.
	MaxListLimit = 1000
	// MaxListScan bounds the records one shard examines for one page,
	// matching or not: the page holds the shard's read lock (or engine
	// iterator) for a bounded time, so that listing never stalls writes.
	MaxListScan = 4096
	// MaxListShardsPerPage bounds the shards one page asks, so that a page
	// over a namespace that is empty in most shards still returns quickly
	// (with fewer keys than the limit and a next page token).
	MaxListShardsPerPage = 16
)

// ListQuery asks for one page of the keys of a namespace.
type ListQuery struct {
	Namespace string
	// State: only keys in this state; 0 means both.
	State fsm.State
	// OlderThan: only keys whose current owner reserved them at least this
	// long ago (by the shard leader's clock); 0 means any age.
	OlderThan time.Duration
	// Limit is the largest page, 1..MaxListLimit; 0 means DefaultListLimit.
	Limit int
	// PageToken is the previous page's NextPageToken; "" starts at the
	// beginning.
	PageToken string
}

// ListPage is one page of a listing.
type ListPage struct {
	Keys []fsm.ListedRecord
	// NextPageToken continues the listing; "" on the last page. A page may
	// hold fewer keys than the limit (even none) and still have a next one.
	NextPageToken string
}

// ShardQuery is one shard's part of a page: a ListQuery with the key to
// start after instead of a token.
type ShardQuery struct {
	Namespace string
	State     fsm.State
	OlderThan time.Duration
	Limit     int
	After     string
}

// FSMQuery is q as the state machine takes it at now (Unix nanoseconds),
// with the work bound MaxListScan.
func (q ShardQuery) FSMQuery(now int64) fsm.ListQuery {
	fq := fsm.ListQuery{Namespace: q.Namespace, After: q.After, State: q.State, Limit: q.Limit, MaxScan: max(MaxListScan, q.Limit)}
	if q.OlderThan > 0 {
		fq.CreatedBefore = now - int64(q.OlderThan) + 1
	}
	return fq
}

// ErrBadPageToken: a page token that this cluster did not issue (or issued
// for another topology). Clients see 400 INVALID_ARGUMENT.
var ErrBadPageToken = errors.New("backend: invalid page token")

// pageTokenVersion is the first byte of every page token.
const pageTokenVersion = 1

// encodePageToken is the opaque token of the position "shard, after key".
func encodePageToken(shard, after string) string {
	b := []byte{pageTokenVersion}
	b = binary.AppendUvarint(b, uint64(len(shard)))
	b = append(b, shard...)
	b = append(b, after...)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodePageToken(tok string) (shard, after string, err error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil || len(b) < 2 || b[0] != pageTokenVersion {
		return "", "", ErrBadPageToken
	}
	n, w := binary.Uvarint(b[1:])
	if w <= 0 || n > uint64(len(b)-1-w) {
		return "", "", ErrBadPageToken
	}
	rest := b[1+w:]
	return string(rest[:n]), string(rest[n:]), nil
}

// ListShards answers one page of q over shards (their ids, in a fixed
// order: every page of a listing must see the same order), asking list for
// each shard's part. The token is an opaque (shard id, last key examined):
// the listing visits the shards one after another and each in key order,
// so a full listing covers every shard exactly once; each shard's part of a
// page is one consistent read of that shard. Keys reserved or removed
// while a listing runs may or may not appear, as with any paged scan.
func ListShards(ctx context.Context, shards []string, q ListQuery,
	list func(ctx context.Context, shard string, sq ShardQuery) (fsm.ListPage, error)) (ListPage, error) {
	limit := q.Limit
	if limit == 0 {
		limit = DefaultListLimit
	}
	if limit < 1 || limit > MaxListLimit {
		return ListPage{}, &Error{Code: contract.CodeInvalidArgument, Message: fmt.Sprintf("limit %d is out of range 1..%d", q.Limit, MaxListLimit)}
	}
	start, after := 0, ""
	if q.PageToken != "" {
		shard, a, err := decodePageToken(q.PageToken)
		start = -1
		for i, id := range shards {
			if err == nil && id == shard {
				start = i
			}
		}
		if start < 0 {
			return ListPage{}, &Error{Code: contract.CodeInvalidArgument,
				Message: "page_token is not one this cluster issued (or the topology changed since): start the listing again without it"}
		}
		after = a
	}
	var page ListPage
	asked := 0
	for i := start; i < len(shards); i++ {
		if len(page.Keys) == limit || asked == MaxListShardsPerPage {
			page.NextPageToken = encodePageToken(shards[i], after)
			return page, nil
		}
		asked++
		p, err := list(ctx, shards[i], ShardQuery{Namespace: q.Namespace, State: q.State, OlderThan: q.OlderThan,
			Limit: limit - len(page.Keys), After: after})
		if err != nil {
			return ListPage{}, err
		}
		page.Keys = append(page.Keys, p.Records...)
		if !p.Done {
			page.NextPageToken = encodePageToken(shards[i], p.Last)
			return page, nil
		}
		after = ""
	}
	return page, nil
}

package statedb

import (
	"encoding/binary"
	"fmt"

	"github.com/idem-dev/idem/fsm"
)

// Engine layout (one pebble engine per node, every hosted shard in it):
//
//	0x01 shard 0x00                      -> current generation (8 bytes, big endian)
//	0x02 shard 0x00 gen(8) 'm'           -> the shard's meta: fsm.Meta and the applied Raft index
//	0x02 shard 0x00 gen(8) 'r' key       -> record (fsm.AppendRecord)
//	0x02 shard 0x00 gen(8) 'e' t(8) key  -> RecordBytes : COMPLETED record expiring at t
//	0x02 shard 0x00 gen(8) 'l' t(8) key  -> RecordBytes : IN_PROGRESS record whose lease ends at t
//	0x02 shard 0x00 gen(8) 'p' p(4) key  -> empty       : a record of ring partition p (Config.PartitionCount set)
//	0x02 shard 0x00 gen(8) 'P'           -> count(4)    : the partition index is complete for count partitions
//
// key is the (namespace, key) pair in an order-preserving encoding (0x00
// escaped as 0x00 0xff, the namespace ended by 0x00 0x01), so records are
// stored in (namespace, key) order: the snapshot order. t is a time with its
// sign bit flipped, so big-endian bytes sort as the signed times do. Shard
// ids never hold 0x00. A Restore fills generation gen+1 and switches the
// generation key in one synced write; other generations are garbage.
const (
	tagGen    = 0x01
	tagShard  = 0x02
	subMeta   = 'm'
	subRecord = 'r'
	subExpiry = 'e'
	subLease  = 'l'
	subPart   = 'p'
	subParts  = 'P'
)

func genKey(shard string) []byte {
	return append(append([]byte{tagGen}, shard...), 0)
}

// shardPrefix is the prefix of every generation of shard.
func shardPrefix(shard string) []byte {
	return append(append([]byte{tagShard}, shard...), 0)
}

func genPrefix(shard string, gen uint64) []byte {
	return binary.BigEndian.AppendUint64(shardPrefix(shard), gen)
}

func sub(prefix []byte, tag byte) []byte {
	return append(append(make([]byte, 0, len(prefix)+64), prefix...), tag)
}

func appendTime(b []byte, t int64) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(t)^(1<<63))
}

func appendEscaped(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			b = append(b, 0, 0xff)
		} else {
			b = append(b, s[i])
		}
	}
	return b
}

func appendKey(b []byte, k fsm.RecordKey) []byte {
	b = appendEscaped(b, k.Namespace)
	b = append(b, 0, 1)
	return appendEscaped(b, k.Key)
}

func decodeKey(b []byte) (fsm.RecordKey, error) {
	var k fsm.RecordKey
	var cur []byte
	inKey := false
	for i := 0; i < len(b); i++ {
		if b[i] != 0 {
			cur = append(cur, b[i])
			continue
		}
		if i+1 == len(b) {
			return k, fmt.Errorf("statedb: key ends inside an escape")
		}
		i++
		switch {
		case b[i] == 0xff:
			cur = append(cur, 0)
		case b[i] == 1 && !inKey:
			k.Namespace, cur, inKey = string(cur), nil, true
		default:
			return k, fmt.Errorf("statedb: bad escape 0x00 0x%02x in key", b[i])
		}
	}
	if !inKey {
		return k, fmt.Errorf("statedb: key without namespace terminator")
	}
	k.Key = string(cur)
	return k, nil
}

// prefixEnd is the first key after every key starting with p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// encodeMeta and decodeMeta are the value of the meta key.
func encodeMeta(m fsm.Meta, applied uint64) []byte {
	b := []byte{1} // version
	b = binary.AppendVarint(b, m.Clock)
	b = binary.AppendUvarint(b, m.LastIndex)
	b = binary.AppendVarint(b, m.InProgress)
	b = binary.AppendVarint(b, m.Completed)
	b = binary.AppendVarint(b, m.Bytes)
	b = binary.AppendUvarint(b, applied)
	if m.Tombstones != 0 || m.Policies != 0 {
		// Optional tail (v1.2): a meta without it has none of either.
		b = binary.AppendVarint(b, m.Tombstones)
		b = binary.AppendVarint(b, m.Policies)
	}
	return b
}

func decodeMeta(b []byte) (m fsm.Meta, applied uint64, err error) {
	if len(b) == 0 || b[0] != 1 {
		return m, 0, fmt.Errorf("%w: shard meta of an unknown version", fsm.ErrCorrupt)
	}
	b = b[1:]
	vals := make([]uint64, 6)
	for i := range vals {
		var n int
		if i == 1 || i == 5 {
			vals[i], n = binary.Uvarint(b)
		} else {
			var v int64
			v, n = binary.Varint(b)
			vals[i] = uint64(v)
		}
		if n <= 0 {
			return m, 0, fmt.Errorf("%w: shard meta truncated", fsm.ErrCorrupt)
		}
		b = b[n:]
	}
	m = fsm.Meta{Clock: int64(vals[0]), LastIndex: vals[1], InProgress: int64(vals[2]), Completed: int64(vals[3]), Bytes: int64(vals[4])}
	if len(b) > 0 {
		t, n := binary.Varint(b)
		if n <= 0 {
			return m, 0, fmt.Errorf("%w: shard meta tail truncated", fsm.ErrCorrupt)
		}
		p, n2 := binary.Varint(b[n:])
		if n2 <= 0 || len(b) != n+n2 {
			return m, 0, fmt.Errorf("%w: shard meta tail malformed", fsm.ErrCorrupt)
		}
		m.Tombstones, m.Policies = t, p
	}
	return m, vals[5], nil
}

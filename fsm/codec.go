package fsm

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
)

// commandVersion is the first byte of every encoded command. A replica that
// meets a version it does not know answers OutcomeInvalid for that entry
// instead of guessing.
const commandVersion = 1

// commandVersionExt starts a command that carries the v1.2 fields
// (Command.LeaseIsDefault and what follows it): the version-1 layout, the
// clock tail always present (quorum 0 when none), then the extension. A
// command without those fields is still written as version 1, byte for
// byte as before. (2 is packedVersion.)
const commandVersionExt = 3

// Bits of the extension's flags byte.
const (
	extLeaseIsDefault = 1 << iota
	extRetentionIsDefault
	extIfExpiredAcquire
	extCheckpoint
	extPolicy
	extTombstoneSet
	extHandoff
	// extFence follows extHandoff: the handoff's attempt, the source's
	// clock and the digest an open expects (Handoff.Attempt, Clock,
	// Expect). Releases before fenced handoff refuse the bit (the cluster
	// version keeps them from ever meeting it).
	extFence
)

// MaxCheckpointBytes bounds a checkpoint's data (64 KiB, the contract's
// limit); a longer one does not decode.
const MaxCheckpointBytes = 64 << 10

func hasExt(cmd *Command) bool {
	return cmd.LeaseIsDefault || cmd.RetentionIsDefault || cmd.IfExpiredAcquire || cmd.Checkpoint != nil || cmd.Policy != nil || cmd.Handoff != nil
}

// maxClockReadings bounds the clock readings of one command (one per voter;
// a topology has at most 7).
const maxClockReadings = 64

// packedVersion is the first byte of a packed entry (EncodePacked): many
// commands in one Raft entry. A replica of a version before packing reads it
// as an unknown command version, which is why packing is switched on only
// once every replica understands it.
const packedVersion = 2

// IsPacked reports whether a log entry's bytes are a packed entry.
func IsPacked(data []byte) bool { return len(data) > 0 && data[0] == packedVersion }

// EncodePacked packs encoded commands (EncodeCommand) into one log entry:
//
//	packedVersion | uvarint count | count x (uvarint length | command bytes)
//
// At most MaxPackedCommands commands; FSM.ApplyPackedEntry applies them in
// order, each with its own fencing-token slot.
func EncodePacked(cmds [][]byte) []byte {
	n := 1 + binary.MaxVarintLen64
	for _, c := range cmds {
		n += binary.MaxVarintLen32 + len(c)
	}
	b := make([]byte, 0, n)
	b = append(b, packedVersion)
	b = binary.AppendUvarint(b, uint64(len(cmds)))
	for _, c := range cmds {
		b = binary.AppendUvarint(b, uint64(len(c)))
		b = append(b, c...)
	}
	return b
}

// DecodePacked is the inverse of EncodePacked; the commands alias data.
func DecodePacked(data []byte) ([][]byte, error) {
	if !IsPacked(data) {
		return nil, fmt.Errorf("%w: not a packed entry", ErrCorrupt)
	}
	buf := data[1:]
	count, n := binary.Uvarint(buf)
	if n <= 0 || count == 0 || count > MaxPackedCommands {
		return nil, fmt.Errorf("%w: packed entry count", ErrCorrupt)
	}
	buf = buf[n:]
	out := make([][]byte, 0, count)
	for range count {
		l, n := binary.Uvarint(buf)
		if n <= 0 || l > uint64(len(buf)-n) {
			return nil, fmt.Errorf("%w: packed entry command %d of %d is cut short", ErrCorrupt, len(out), count)
		}
		out = append(out, buf[n:n+int(l)])
		buf = buf[n+int(l):]
	}
	if len(buf) != 0 {
		return nil, fmt.Errorf("%w: %d trailing bytes after a packed entry", ErrCorrupt, len(buf))
	}
	return out, nil
}

// Packer packs encoded commands with EncodePacked; it is what raftstore's
// proposal buffer (raftstore.Config.Packer) is given.
type Packer struct{}

// PackCommands implements raftstore.CommandPacker.
func (Packer) PackCommands(cmds [][]byte) []byte { return EncodePacked(cmds) }

// EncodeCommand encodes cmd for the Raft log. The encoding is deterministic
// (headers are written in sorted order), compact, and versioned.
func EncodeCommand(cmd *Command) []byte {
	// Room for everything, so the buffer is allocated once: two bytes,
	// seven varints and three more for the clock tail (10 bytes at most
	// each), four length prefixes, and the readings.
	n := 2 + 10*10 + 4*binary.MaxVarintLen32 + len(cmd.Namespace) + len(cmd.Key) + len(cmd.Fingerprint) + len(cmd.OwnerToken) +
		binary.MaxVarintLen64*len(cmd.ClockReadings)
	if cmd.Response != nil {
		n += responseSize(cmd.Response) + 16 // responseSize is the accounting's figure, a little short of the encoding
	}
	ext := hasExt(cmd)
	version := byte(commandVersion)
	if ext {
		version = commandVersionExt
		n += 1 + 5*binary.MaxVarintLen64
		if cmd.Checkpoint != nil {
			n += 2*binary.MaxVarintLen32 + len(cmd.Checkpoint.Name) + len(cmd.Checkpoint.Data)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, version, byte(cmd.Op))
	b = appendString(b, cmd.Namespace)
	b = appendString(b, cmd.Key)
	b = binary.AppendVarint(b, cmd.Now)
	b = appendString(b, cmd.Fingerprint)
	b = appendString(b, cmd.OwnerToken)
	b = binary.AppendVarint(b, cmd.Lease)
	b = binary.AppendVarint(b, cmd.SkewMargin)
	b = appendResponse(b, cmd.Response)
	b = binary.AppendVarint(b, cmd.Retention)
	b = binary.AppendVarint(b, cmd.AbandonAfter)
	b = binary.AppendUvarint(b, uint64(cmd.MaxSweep))
	if cmd.ClockQuorum > 0 || ext {
		// Optional tail: entries without it (written before clock
		// readings existed) decode with ClockQuorum 0.
		b = binary.AppendUvarint(b, uint64(cmd.ClockQuorum))
		b = binary.AppendVarint(b, cmd.ClockBound)
		b = binary.AppendUvarint(b, uint64(len(cmd.ClockReadings)))
		for _, r := range cmd.ClockReadings {
			b = binary.AppendVarint(b, r)
		}
	}
	if ext {
		b = appendExt(b, cmd)
	}
	return b
}

func appendExt(b []byte, cmd *Command) []byte {
	var flags byte
	for _, f := range []struct {
		on  bool
		bit byte
	}{
		{cmd.LeaseIsDefault, extLeaseIsDefault},
		{cmd.RetentionIsDefault, extRetentionIsDefault},
		{cmd.IfExpiredAcquire, extIfExpiredAcquire},
		{cmd.Checkpoint != nil, extCheckpoint},
		{cmd.Policy != nil, extPolicy},
		{cmd.Policy != nil && cmd.Policy.TombstoneSet, extTombstoneSet},
		{cmd.Handoff != nil, extHandoff},
		{cmd.Handoff != nil && cmd.Handoff.fenced(), extFence},
	} {
		if f.on {
			flags |= f.bit
		}
	}
	b = append(b, flags)
	if c := cmd.Checkpoint; c != nil {
		b = appendString(b, c.Name)
		b = appendBytes(b, c.Data)
	}
	if p := cmd.Policy; p != nil {
		b = appendPolicy(b, p)
	}
	if h := cmd.Handoff; h != nil {
		b = appendHandoff(b, h)
		if h.fenced() {
			b = binary.AppendUvarint(b, h.Attempt)
			b = binary.AppendVarint(b, h.Clock)
			b = binary.AppendUvarint(b, h.Expect.Records)
			b = binary.BigEndian.AppendUint64(b, h.Expect.Sum)
		}
	}
	return b
}

// appendHandoff encodes h: count, the partitions (each as its distance from
// the previous one), epoch, peer, floor, reset, limit, then the records as
// AppendRecord frames.
func appendHandoff(b []byte, h *Handoff) []byte {
	b = binary.AppendUvarint(b, uint64(h.Count))
	b = binary.AppendUvarint(b, uint64(len(h.Partitions)))
	prev := uint64(0)
	for _, p := range h.Partitions {
		b = binary.AppendUvarint(b, uint64(p)-prev)
		prev = uint64(p)
	}
	b = binary.AppendUvarint(b, h.Epoch)
	b = appendString(b, h.Peer)
	b = binary.AppendUvarint(b, h.Floor)
	reset := byte(0)
	if h.Reset {
		reset = 1
	}
	b = append(b, reset)
	b = binary.AppendUvarint(b, uint64(h.Limit))
	b = binary.AppendUvarint(b, uint64(len(h.Records)))
	for _, kr := range h.Records {
		b = appendBytes(b, AppendRecord(nil, kr.K, kr.R))
	}
	return b
}

func (d *decoder) handoff() *Handoff {
	h := &Handoff{Count: uint32(min(d.uvarint(), MaxPartitionCount+1))}
	n := d.uvarint()
	if n > MaxHandoffPartitions {
		d.fail("handoff partitions")
		return nil
	}
	prev := uint64(0)
	for i := uint64(0); i < n && d.err == nil; i++ {
		p := prev + d.uvarint()
		if p > MaxPartitionCount {
			d.fail("handoff partition")
			return nil
		}
		h.Partitions = append(h.Partitions, uint32(p))
		prev = p
	}
	h.Epoch = d.uvarint()
	h.Peer = d.string()
	h.Floor = d.uvarint()
	switch d.byte() {
	case 0:
	case 1:
		h.Reset = true
	default:
		d.fail("handoff reset")
	}
	h.Limit = int(min(d.uvarint(), math.MaxInt32))
	records := d.uvarint()
	for i := uint64(0); i < records && d.err == nil; i++ {
		frame := d.bytes()
		if d.err != nil {
			break
		}
		k, r, err := DecodeRecord(frame)
		if err != nil {
			d.err = err
			break
		}
		h.Records = append(h.Records, KeyedRecord{K: k, R: r})
	}
	return h
}

func appendPolicy(b []byte, p *Policy) []byte {
	for _, v := range []int64{p.DefaultLease, p.MaxLease, p.DefaultRetention, p.MaxRetention, p.Tombstone} {
		b = binary.AppendVarint(b, v)
	}
	return b
}

func (d *decoder) policy(tombstoneSet bool) *Policy {
	p := &Policy{TombstoneSet: tombstoneSet}
	for _, v := range []*int64{&p.DefaultLease, &p.MaxLease, &p.DefaultRetention, &p.MaxRetention, &p.Tombstone} {
		*v = d.varint()
	}
	return p
}

func (d *decoder) ext(cmd *Command) {
	flags := d.byte()
	if flags&^(extFence<<1-1) != 0 || (flags&extTombstoneSet != 0 && flags&extPolicy == 0) || (flags&extFence != 0 && flags&extHandoff == 0) {
		d.fail("command extension flags")
		return
	}
	cmd.LeaseIsDefault = flags&extLeaseIsDefault != 0
	cmd.RetentionIsDefault = flags&extRetentionIsDefault != 0
	cmd.IfExpiredAcquire = flags&extIfExpiredAcquire != 0
	if flags&extCheckpoint != 0 {
		c := &Checkpoint{Name: d.string()}
		if data := d.bytes(); len(data) > 0 {
			if len(data) > MaxCheckpointBytes {
				d.fail("checkpoint data length")
				return
			}
			c.Data = append([]byte(nil), data...)
		}
		cmd.Checkpoint = c
	}
	if flags&extPolicy != 0 {
		cmd.Policy = d.policy(flags&extTombstoneSet != 0)
	}
	if flags&extHandoff != 0 && d.err == nil {
		cmd.Handoff = d.handoff()
	}
	if flags&extFence != 0 && d.err == nil {
		h := cmd.Handoff
		h.Attempt = d.uvarint()
		h.Clock = d.varint()
		h.Expect.Records = d.uvarint()
		h.Expect.Sum = d.uint64()
		if d.err == nil && !h.fenced() {
			d.fail("handoff fence") // one encoding per command
		}
	}
}

// DecodeCommand is the inverse of EncodeCommand.
func DecodeCommand(data []byte) (*Command, error) {
	d := decoder{buf: data}
	v := d.byte()
	if v != commandVersion && v != commandVersionExt {
		if d.err != nil {
			return nil, d.err
		}
		return nil, fmt.Errorf("%w: unknown command version %d", ErrCorrupt, v)
	}
	ext := v == commandVersionExt
	cmd := &Command{Op: Op(d.byte())}
	cmd.Namespace = d.string()
	cmd.Key = d.string()
	cmd.Now = d.varint()
	cmd.Fingerprint = d.string()
	cmd.OwnerToken = d.string()
	cmd.Lease = d.varint()
	cmd.SkewMargin = d.varint()
	cmd.Response = d.response()
	cmd.Retention = d.varint()
	cmd.AbandonAfter = d.varint()
	cmd.MaxSweep = int(d.uvarint())
	if d.err == nil && (len(d.buf) != 0 || ext) {
		q := d.uvarint()
		if q > maxClockReadings {
			// A quorum of more voters than a command has readings for is
			// not one EncodeCommand wrote, and int(q) could turn negative
			// (found by FuzzDecodeCommand,
			// testdata/fuzz/FuzzDecodeCommand/a6043642367423bb).
			d.fail("clock quorum out of range")
			q = 0
		}
		cmd.ClockQuorum = int(q)
		if d.err == nil && cmd.ClockQuorum == 0 && !ext {
			// EncodeCommand writes the tail only with a quorum: one with
			// none is not a command it wrote (found by FuzzDecodeCommand,
			// testdata/fuzz/FuzzDecodeCommand/76cd630773c76ec9).
			d.err = fmt.Errorf("%w: clock readings without a quorum", ErrCorrupt)
		}
		cmd.ClockBound = d.varint()
		n := d.uvarint()
		if n > maxClockReadings {
			d.err = fmt.Errorf("%w: %d clock readings", ErrCorrupt, n)
		}
		if cmd.ClockQuorum == 0 && (n != 0 || cmd.ClockBound != 0) {
			d.fail("clock readings without a quorum")
		}
		for i := uint64(0); i < n && d.err == nil; i++ {
			cmd.ClockReadings = append(cmd.ClockReadings, d.varint())
		}
	}
	if ext {
		d.ext(cmd)
		if d.err == nil && !hasExt(cmd) {
			// EncodeCommand writes version 1 then: one byte stream per command.
			d.fail("extension without a field")
		}
	}
	if d.err == nil && len(d.buf) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", ErrCorrupt, len(d.buf))
	}
	if d.err != nil {
		return nil, d.err
	}
	return cmd, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBytes(b []byte, p []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

// appendResponse writes a presence byte, then status, sorted headers and body.
func appendResponse(b []byte, r *Response) []byte {
	if r == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	b = binary.AppendVarint(b, int64(r.Status))
	names := make([]string, 0, len(r.Headers))
	for name := range r.Headers {
		names = append(names, name)
	}
	sort.Strings(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = appendString(b, name)
		b = appendString(b, r.Headers[name])
	}
	return appendBytes(b, r.Body)
}

func responseSize(r *Response) int {
	n := 16 + len(r.Body)
	for k, v := range r.Headers {
		n += len(k) + len(v) + 4
	}
	return n
}

// decoder reads what the append functions wrote; the first error sticks and
// every later read returns a zero value, so callers check err once.
type decoder struct {
	buf []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated or malformed %s", ErrCorrupt, what)
	}
	d.buf = nil
}

func (d *decoder) byte() byte {
	if d.err != nil || len(d.buf) < 1 {
		d.fail("byte")
		return 0
	}
	v := d.buf[0]
	d.buf = d.buf[1:]
	return v
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.buf)
	if n <= 0 {
		d.fail("uvarint")
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *decoder) uint64() uint64 {
	if d.err != nil || len(d.buf) < 8 {
		d.fail("uint64")
		return 0
	}
	v := binary.BigEndian.Uint64(d.buf)
	d.buf = d.buf[8:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.buf)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.buf)) {
		d.fail("length-prefixed field")
		return nil
	}
	p := d.buf[:n:n]
	d.buf = d.buf[n:]
	return p
}

func (d *decoder) string() string { return string(d.bytes()) }

func (d *decoder) response() *Response {
	switch d.byte() {
	case 0:
		return nil
	case 1:
	default:
		d.fail("response presence byte")
		return nil
	}
	status := d.varint()
	if status < math.MinInt32 || status > math.MaxInt32 {
		d.fail("response status")
		return nil
	}
	r := &Response{Status: int32(status)}
	count := d.uvarint()
	if count > uint64(len(d.buf)) { // each header takes at least two bytes
		d.fail("header count")
		return nil
	}
	if count > 0 {
		r.Headers = make(map[string]string, count)
		for i := uint64(0); i < count && d.err == nil; i++ {
			name := d.string()
			r.Headers[name] = d.string()
		}
	}
	if body := d.bytes(); len(body) > 0 {
		r.Body = append([]byte(nil), body...)
	}
	return r
}

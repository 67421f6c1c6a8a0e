package server

import (
	"encoding/binary"
	"errors"
	"time"
)

// errCorrupt reports a log entry or snapshot that does not decode.
var errCorrupt = errors.New("dlockd: corrupt command or snapshot")

// enc appends fields in the compact binary form used by log entries and
// snapshots: unsigned varints, and strings as a varint length then bytes.
type enc struct{ b []byte }

func (e *enc) u64(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *enc) str(s string) { e.u64(uint64(len(s))); e.b = append(e.b, s...) }
func (e *enc) byte1(v byte) { e.b = append(e.b, v) }
func (e *enc) dur(d time.Duration) {
	if d < 0 {
		d = 0
	}
	e.u64(uint64(d))
}
func (e *enc) boolean(v bool) {
	if v {
		e.byte1(1)
	} else {
		e.byte1(0)
	}
}

// dec reads what enc wrote. After the first error every read returns zero
// values and err stays set, so callers check err once at the end.
type dec struct {
	b   []byte
	err error
}

func (d *dec) u64() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errCorrupt
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *dec) str() string {
	n := d.u64()
	if d.err != nil {
		return ""
	}
	if n > uint64(len(d.b)) {
		d.err = errCorrupt
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *dec) byte1() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.err = errCorrupt
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *dec) dur() time.Duration {
	v := d.u64()
	if v > uint64(1<<62) {
		d.err = errCorrupt
		return 0
	}
	return time.Duration(v)
}

func (d *dec) boolean() bool { return d.byte1() == 1 }

// bytes reads what enc.u64(len) then the bytes wrote, as a copy.
func (d *dec) bytes() []byte {
	n := d.u64()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = errCorrupt
		return nil
	}
	v := append([]byte(nil), d.b[:n]...)
	d.b = d.b[n:]
	return v
}

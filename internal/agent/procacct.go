package agent

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"strings"
)

// Process accounting (acct(2), BSD v3 records) for the start profile: every process that
// exits in the window leaves its name, parent and CPU, so the short-lived ones a start
// runs (iptables, CNI plugins, runc) are counted one by one, which /proc samples miss.

// acctRecord is one struct acct_v3 (include/uapi/linux/acct.h), 64 bytes.
type acctRecord struct {
	PID, PPID uint32
	Comm      string
	CPU       float64 // seconds, user + system
	Elapsed   float64 // seconds
}

const acctRecordSize = 64

// acctHZ is the unit of acct_v3's times (AHZ).
const acctHZ = 100

// decodeComp decodes comp_t: a 13-bit mantissa and a 3-bit base-8 exponent.
func decodeComp(v uint16) float64 {
	return float64(uint64(v&0x1fff) << (3 * uint(v>>13)))
}

// parseAcct decodes a file of acct_v3 records.
func parseAcct(b []byte) ([]acctRecord, error) {
	if len(b)%acctRecordSize != 0 {
		return nil, fmt.Errorf("process accounting: %d bytes is not a whole number of %d-byte records", len(b), acctRecordSize)
	}
	var out []acctRecord
	for ; len(b) > 0; b = b[acctRecordSize:] {
		if b[1]&0x0f != 3 {
			return nil, fmt.Errorf("process accounting: record version %d, want 3", b[1]&0x0f)
		}
		le := binary.LittleEndian
		comm := b[48:64]
		if i := strings.IndexByte(string(comm), 0); i >= 0 {
			comm = comm[:i]
		}
		out = append(out, acctRecord{
			PID:     le.Uint32(b[16:]),
			PPID:    le.Uint32(b[20:]),
			Elapsed: float64(math.Float32frombits(le.Uint32(b[28:]))) / acctHZ,
			CPU:     (decodeComp(le.Uint16(b[32:])) + decodeComp(le.Uint16(b[34:]))) / acctHZ,
			Comm:    string(comm),
		})
	}
	return out, nil
}

// acctSummary is one line per process name, most CPU first: how many exited and the CPU
// they used, e.g. "iptables 12x 1.43s".
func acctSummary(recs []acctRecord) []string {
	type sum struct {
		n   int
		cpu float64
	}
	by := map[string]*sum{}
	for _, r := range recs {
		s := by[r.Comm]
		if s == nil {
			s = &sum{}
			by[r.Comm] = s
		}
		s.n++
		s.cpu += r.CPU
	}
	names := make([]string, 0, len(by))
	for n := range by {
		names = append(names, n)
	}
	sort.Slice(names, func(i, k int) bool {
		if by[names[i]].cpu != by[names[k]].cpu {
			return by[names[i]].cpu > by[names[k]].cpu
		}
		return names[i] < names[k]
	})
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = fmt.Sprintf("%s %dx %.2fs", n, by[n].n, by[n].cpu)
	}
	return out
}

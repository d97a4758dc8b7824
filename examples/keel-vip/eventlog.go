package keelvip

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vipkit/vipkit/internal/syncx"
)

// EventLog appends one line per add and remove of a VIP address:
//
//	<CLOCK_BOOTTIME ns> <node> add|remove <vip>
//
// All network namespaces of a machine share one kernel and one
// CLOCK_BOOTTIME, so the logs of every node merge into one timeline
// (ReadEvents, then sort). An add is stamped before the address exists and
// a remove after it is gone, so the intervals a log shows contain the real
// ones. A nil *EventLog records nothing. Safe for concurrent use.
type EventLog struct {
	node string           // +checklocksignore: set by the constructor, read-only after
	now  func() time.Time // +checklocksignore: set by the constructor, read-only after
	// mu serializes the lines written to f, so that each is whole.
	mu syncx.Mutex
	f  *os.File
}

// OpenEventLog opens (creating, 0644) the log at path for node; now is the
// clock (CLOCK_BOOTTIME in production: claim.BootClock{}.Now).
func OpenEventLog(path, node string, now func() time.Time) (*EventLog, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("keelvip: event log: %w", err)
	}
	return &EventLog{node: node, now: now, f: f}, nil
}

// Record appends one event; errors are ignored (the log is evidence, not
// control).
func (l *EventLog) Record(op string, vip netip.Addr) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintf(l.f, "%d %s %s %v\n", l.now().UnixNano(), l.node, op, vip)
}

// Close closes the log.
func (l *EventLog) Close() error {
	if l == nil {
		return nil
	}
	return l.f.Close()
}

// Event is one line of an EventLog.
type Event struct {
	At   time.Duration // CLOCK_BOOTTIME
	Node string
	Add  bool
	VIP  netip.Addr
}

// MaxEventLine bounds a line of an event log, in bytes.
const MaxEventLine = 256

// ReadEvents parses an event log. A malformed line is an error naming it
// (ErrMesh is not involved: the error wraps nothing but says the line).
func ReadEvents(r io.Reader) ([]Event, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, MaxEventLine), MaxEventLine)
	var out []Event
	for n := 1; sc.Scan(); n++ {
		e, err := ParseEvent(sc.Text())
		if err != nil {
			return out, fmt.Errorf("keelvip: event log line %d: %w", n, err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("keelvip: event log: %w", err)
	}
	return out, nil
}

// ParseEvent parses one line of an event log.
func ParseEvent(line string) (Event, error) {
	f := strings.Fields(line)
	if len(f) != 4 {
		return Event{}, fmt.Errorf("want 4 fields, got %d", len(f))
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || ns < 0 {
		return Event{}, fmt.Errorf("bad timestamp %q", f[0])
	}
	e := Event{At: time.Duration(ns), Node: f[1]}
	switch f[2] {
	case "add":
		e.Add = true
	case "remove":
	default:
		return Event{}, fmt.Errorf("bad op %q", f[2])
	}
	if e.VIP, err = netip.ParseAddr(f[3]); err != nil {
		return Event{}, fmt.Errorf("bad vip %q", f[3])
	}
	return e, nil
}

// SortEvents orders events by time; at equal times a remove comes first
// only if it is the same node's (never hides an overlap of two nodes).
func SortEvents(es []Event) {
	slices.SortStableFunc(es, func(a, b Event) int {
		if a.At != b.At {
			if a.At < b.At {
				return -1
			}
			return 1
		}
		return 0
	})
}

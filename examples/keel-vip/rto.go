package keelvip

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The etcd hosts' TCP setting the README asks for (section "etcd hosts:
// cap TCP's retransmission backoff"), which the controller checks at start
// when the mesh file names etcd endpoints.
const (
	rtoMaxSysctl  = "net.ipv4.tcp_rto_max_ms"
	rtoMaxWantMs  = 1000
	rtoMaxReadme  = "examples/keel-vip/README.md, \"etcd hosts: cap TCP's retransmission backoff\""
	rtoMaxMissing = "missing (Linux before 6.15)"
)

// checkRTOMax reads net.ipv4.tcp_rto_max_ms under procRoot ("/proc" on a
// host) and reports its value as read (or why it has none) and whether it
// caps TCP's retransmission timeout at rtoMaxWantMs or less.
func checkRTOMax(procRoot string) (value string, ok bool) {
	b, err := os.ReadFile(filepath.Join(procRoot, "sys", "net", "ipv4", "tcp_rto_max_ms"))
	if errors.Is(err, fs.ErrNotExist) {
		return rtoMaxMissing, false
	}
	if err != nil {
		return "unreadable: " + err.Error(), false
	}
	s := strings.TrimSpace(string(b))
	ms, err := strconv.Atoi(s)
	if err != nil {
		return strconv.Quote(s) + " (not a number)", false
	}
	return s, ms > 0 && ms <= rtoMaxWantMs
}

// warnRTOMax logs one WARN line when checkRTOMax finds the setting missing
// or above rtoMaxWantMs. It never stops the start.
func warnRTOMax(log *slog.Logger, procRoot string) {
	value, ok := checkRTOMax(procRoot)
	if ok {
		return
	}
	log.Warn("TCP's retransmission backoff is not capped: etcd streams can stay stalled long after a partition heals",
		"setting", rtoMaxSysctl, "value", value, "want", "<= "+strconv.Itoa(rtoMaxWantMs), "see", rtoMaxReadme)
}

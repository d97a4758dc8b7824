//go:build linux

package keelvip

import "path/filepath"

// raceSetup is what the symlink race runs against, once per round: every
// step by which the helper gives its children their directories, sockets
// and pair copy in spawn mode.
func raceSetup(h *helper) error {
	if err := h.prepareSpawn(); err != nil {
		return err
	}
	for _, p := range []string{filepath.Join(ctlDir(h.m), "helper.sock"), filepath.Join(membersDir(h.m), "members.sock")} {
		l, err := listenUnix(h.m, p, 0o666)
		if err != nil {
			return err
		}
		l.Close()
	}
	return nil
}

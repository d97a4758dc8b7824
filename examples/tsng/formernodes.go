package tsng

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/vipkit/vipkit/vip"
)

// The known-nodes file (<data dir>/<network>.nodes.json) remembers the
// names of the network's members as this agent last saw them, so that a
// backend whose node has since left the member list stays addressable by
// that name (vip.RegistryOptions.FormerNodes). Every agent addresses it by
// its stored node id whatever this file holds.
//
// It holds the current members and the former members that some stored
// backend still names; the rest are dropped when the network opens, so
// the file is bounded by the configuration. It is written whole, to a
// temporary file that is synced and renamed. A file that does not decode
// is an error naming it: it is never reset silently (remove it by hand;
// departed nodes then resolve by id only).

const knownNodesVersion = 1

type knownNodesFile struct {
	Version int             `json:"version"`
	Nodes   []knownNodeName `json:"nodes"`
}

type knownNodeName struct {
	ID   vip.NodeID `json:"id"`
	Name string     `json:"name"`
}

func knownNodesPath(dataDir, network string) string {
	return filepath.Join(dataDir, network+".nodes.json")
}

// loadKnownNodes reads the file; a missing file is an empty list.
func loadKnownNodes(path string) ([]vip.NodeInfo, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f knownNodesFile
	if err := json.Unmarshal(b, &f); err != nil || f.Version != knownNodesVersion {
		return nil, fmt.Errorf("tsng: known-nodes file %s is damaged or of another version (%v); remove it to continue (departed nodes then resolve by id only)", path, err)
	}
	out := make([]vip.NodeInfo, 0, len(f.Nodes))
	for _, n := range f.Nodes {
		if vip.ValidName(n.Name) != nil || n.ID.IsZero() {
			return nil, fmt.Errorf("tsng: known-nodes file %s: bad entry %q for %s; remove it to continue", path, n.Name, n.ID)
		}
		out = append(out, vip.NodeInfo{ID: n.ID, Name: n.Name})
	}
	return out, nil
}

// formerNodes returns the nodes of known that are no members, but are the
// node of a stored backend of services.
func formerNodes(known, members []vip.NodeInfo, services []vip.ServiceView) []vip.NodeInfo {
	member := map[vip.NodeID]bool{}
	for _, m := range members {
		member[m.ID] = true
	}
	used := map[vip.NodeID]bool{}
	for _, v := range services {
		for _, l := range v.Listeners {
			for _, b := range l.Backends {
				used[b.Node] = true
			}
		}
	}
	var out []vip.NodeInfo
	for _, n := range known {
		if !member[n.ID] && used[n.ID] && !slices.ContainsFunc(out, func(o vip.NodeInfo) bool { return o.ID == n.ID }) {
			out = append(out, n)
		}
	}
	return out
}

// saveKnownNodes writes members and former to path atomically.
func saveKnownNodes(path string, members, former []vip.NodeInfo) error {
	f := knownNodesFile{Version: knownNodesVersion, Nodes: []knownNodeName{}}
	for _, n := range append(slices.Clone(members), former...) {
		if n.Name != "" {
			f.Nodes = append(f.Nodes, knownNodeName{ID: n.ID, Name: n.Name})
		}
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

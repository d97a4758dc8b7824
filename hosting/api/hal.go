package api

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/vipkit/vipkit/hosting"
)

// Link is a HAL link.
type Link struct {
	Href string `json:"href"`
	Name string `json:"name,omitempty"`
}

// Links are a share's HAL links: self, and one agents link per host.
type Links struct {
	Self   Link   `json:"self"`
	Agents []Link `json:"agents"`
}

// ShareView is a share as the API answers it.
type ShareView struct {
	ID              string           `json:"id"`
	AccountID       string           `json:"accountId"`
	Kind            hosting.Kind     `json:"kind"`
	Name            string           `json:"name"`
	TargetAddress   string           `json:"targetAddress"`
	TargetPort      uint16           `json:"targetPort"`
	ActiveAgentIDs  []string         `json:"activeAgentIds"`
	PassiveAgentIDs []string         `json:"passiveAgentIds"`
	Hosting         *hosting.Hosting `json:"hosting,omitempty"`
	CreatedAt       string           `json:"createdAt"`
	CreatedBy       string           `json:"createdBy,omitempty"`
	UpdatedAt       string           `json:"updatedAt"`
	UpdatedBy       string           `json:"updatedBy,omitempty"`
	Links           Links            `json:"_links"`
}

// ListView is a listing: one page of the shares that match, and the
// total count.
type ListView struct {
	Count    int `json:"count"` // every share that matches
	Offset   int `json:"offset"`
	Limit    int `json:"limit"`
	Embedded struct {
		Shares []ShareView `json:"shares"`
	} `json:"_embedded"`
	Links struct {
		Self Link  `json:"self"`
		Next *Link `json:"next,omitempty"`
	} `json:"_links"`
}

// Paging of listings.
const (
	DefaultPageLimit = 100
	MaxPageLimit     = 1000
)

const timeFormat = "2006-01-02T15:04:05.000000Z07:00"

func (h *Handler) selfHref(s hosting.Share) string {
	return h.base + "/accounts/" + pathEscape(s.AccountID) + "/" + collection(s.Kind) + "/" + s.ID
}

func (h *Handler) view(v hosting.View) ShareView {
	s := v.Share
	act, pas := slices.Clone(v.ActiveAgentIDs), slices.Clone(v.PassiveAgentIDs)
	if act == nil {
		act = []string{}
	}
	if pas == nil {
		pas = []string{}
	}
	out := ShareView{ID: s.ID, AccountID: s.AccountID, Kind: s.Kind, Name: s.Name, TargetAddress: s.TargetAddress, TargetPort: s.TargetPort,
		ActiveAgentIDs: act, PassiveAgentIDs: pas, Hosting: v.Hosting,
		CreatedAt: s.CreatedAt.UTC().Format(timeFormat), CreatedBy: s.CreatedBy, UpdatedAt: s.UpdatedAt.UTC().Format(timeFormat), UpdatedBy: s.UpdatedBy}
	out.Links.Self = Link{Href: h.selfHref(s)}
	out.Links.Agents = []Link{}
	for _, a := range s.Hosts.All() {
		out.Links.Agents = append(out.Links.Agents, Link{Href: h.agent(s.AccountID, a), Name: a})
	}
	return out
}

var errQuery = errors.New("api: bad query")

// Sortable fields, in the order a sort key names them.
var sortable = map[string]func(a, b hosting.View) int{
	"id":            func(a, b hosting.View) int { return cmp.Compare(a.ID, b.ID) },
	"name":          func(a, b hosting.View) int { return cmp.Compare(a.Name, b.Name) },
	"targetAddress": func(a, b hosting.View) int { return cmp.Compare(a.TargetAddress, b.TargetAddress) },
	"targetPort":    func(a, b hosting.View) int { return cmp.Compare(a.TargetPort, b.TargetPort) },
	"createdAt":     func(a, b hosting.View) int { return a.CreatedAt.Compare(b.CreatedAt) },
	"updatedAt":     func(a, b hosting.View) int { return a.UpdatedAt.Compare(b.UpdatedAt) },
}

// MsgSort is the message of a sort on a field that is not sortable.
const MsgSort = "cannot sort by %q: sortable fields are createdAt, id, name, targetAddress, targetPort, updatedAt"

// parseSort parses sort=field,-field (repeatable) into a comparison.
func parseSort(q url.Values) (func(a, b hosting.View) int, error) {
	var keys []string
	for _, v := range q["sort"] {
		for _, k := range strings.Split(v, ",") {
			if k = strings.TrimSpace(k); k != "" {
				keys = append(keys, k)
			}
		}
	}
	if len(keys) > 8 {
		return nil, fmt.Errorf("%w: at most 8 sort keys", errQuery)
	}
	var cmps []func(a, b hosting.View) int
	for _, k := range keys {
		desc := false
		if rest, ok := strings.CutPrefix(k, "-"); ok {
			k, desc = rest, true
		} else if rest, ok := strings.CutPrefix(k, "+"); ok {
			k = rest
		}
		c, ok := sortable[k]
		if !ok {
			return nil, fmt.Errorf("%w: "+MsgSort, errQuery, k)
		}
		if desc {
			c0 := c
			c = func(a, b hosting.View) int { return -c0(a, b) }
		}
		cmps = append(cmps, c)
	}
	cmps = append(cmps, sortable["id"])
	return func(a, b hosting.View) int {
		for _, c := range cmps {
			if r := c(a, b); r != 0 {
				return r
			}
		}
		return 0
	}, nil
}

var listParams = map[string]bool{"agentId": true, "activeAgentId": true, "passiveAgentId": true, "sort": true, "limit": true, "offset": true}

// MsgPaging is the message of a limit or offset out of range.
const MsgPaging = "limit must be 1 to %d and offset at least 0"

// paging reads the limit and offset of a list query: a limit of 1 to
// MaxPageLimit and an offset of 0 to math.MaxInt. An offset past the end
// of the list is valid (an empty page, see pageBounds).
func paging(q url.Values) (limit, offset int, err error) {
	limit, offset = DefaultPageLimit, 0
	for name, p := range map[string]*int{"limit": &limit, "offset": &offset} {
		if v := q.Get(name); v != "" {
			n, perr := strconv.Atoi(v)
			if name == "offset" && errors.Is(perr, strconv.ErrRange) && !strings.HasPrefix(v, "-") {
				return 0, 0, fmt.Errorf("%w: offset %s is over %d", errQuery, v, math.MaxInt)
			}
			if perr != nil {
				return 0, 0, fmt.Errorf("%w: "+MsgPaging, errQuery, MaxPageLimit)
			}
			*p = n
		}
	}
	if limit < 1 || limit > MaxPageLimit || offset < 0 {
		return 0, 0, fmt.Errorf("%w: "+MsgPaging, errQuery, MaxPageLimit)
	}
	return limit, offset, nil
}

// pageBounds returns the page [lo, hi) of a list of n items at offset
// with at most limit items, and whether items remain after it (the next
// page is then at hi). An offset at or past n is the empty page [n, n).
// It takes offset ≥ 0 and limit ≥ 1 as paging returns them, and never
// computes offset+limit unless it is below n, so nothing overflows.
func pageBounds(n, offset, limit int) (lo, hi int, more bool) {
	lo = min(offset, n)
	hi = lo + min(limit, n-lo)
	return lo, hi, hi < n
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request) {
	kind, ok := pathKind(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	for k, v := range q {
		if !listParams[k] {
			h.fail(w, r, fmt.Errorf("%w: unknown query parameter %q", errQuery, k))
			return
		}
		if k != "sort" && len(v) > 1 {
			h.fail(w, r, fmt.Errorf("%w: %s given %d times", errQuery, k, len(v)))
			return
		}
	}
	order, err := parseSort(q)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	limit, offset, err := paging(q)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	f := hosting.Filter{AccountID: r.PathValue("account"), Kind: kind, AgentID: q.Get("agentId"), ActiveAgentID: q.Get("activeAgentId"), PassiveAgentID: q.Get("passiveAgentId")}
	var vs []hosting.View
	if allows(r, f.AccountID) { // out of scope lists as an account without shares
		if vs, err = h.svc.List(r.Context(), f); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	slices.SortStableFunc(vs, order)
	var out ListView
	out.Count, out.Offset, out.Limit = len(vs), offset, limit
	lo, hi, more := pageBounds(len(vs), offset, limit)
	page := vs[lo:hi]
	out.Embedded.Shares = make([]ShareView, 0, len(page))
	for _, v := range page {
		out.Embedded.Shares = append(out.Embedded.Shares, h.view(v))
	}
	self := h.base + r.URL.Path
	if r.URL.RawQuery != "" {
		self += "?" + r.URL.RawQuery
	}
	out.Links.Self = Link{Href: self}
	if more {
		nq := maps.Clone(q)
		nq.Set("offset", strconv.Itoa(hi))
		nq.Set("limit", strconv.Itoa(limit))
		out.Links.Next = &Link{Href: h.base + r.URL.Path + "?" + nq.Encode()}
	}
	writeJSON(w, http.StatusOK, out)
}

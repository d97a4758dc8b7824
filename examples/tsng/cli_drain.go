package tsng

import (
	"context"
	"net/http"
	"net/url"

	"github.com/vipkit/vipkit/vip"
)

// backendDrainCommand is `tsng vip backend drain` (drain true) or
// `undrain`: a signed edit of the backend's field that every member
// follows (docs/backend-drain.md).
func backendDrainCommand(drain bool) *command {
	cmd := &command{name: "drain", args: "NET VIP PROTO/PORT NODE:PORT",
		short: "Drain a backend: no client makes new bindings to it; existing ones go on until idle expiry.",
		long:  "The drain is shared configuration: it applies on every member and survives restarts. Undo it with `vip backend undrain`.",
		min:   4, max: 4, flags: jsonFlag}
	method := http.MethodPut
	if !drain {
		cmd.name, cmd.short, cmd.long = "undrain", "End a backend's drain: it takes new flows again.", ""
		method = http.MethodDelete
	}
	cmd.run = func(ctx context.Context, c *cliCtx, o *opts, a []string) error {
		p, err := listenerPath(a[0], a[1], a[2])
		if err != nil {
			return err
		}
		return mutateDoc(ctx, c, method, p+"/backends/"+url.PathEscape(a[3])+"/drain", nil)
	}
	return cmd
}

// backendDrain is the API's PUT (drain) or DELETE (undrain) of
// .../backends/{backend}/drain.
func backendDrain(drain bool) func(ctx context.Context, reg *vip.Registry, r *http.Request, k vip.PortKey, _ noBody) (vip.ServiceView, error) {
	return func(ctx context.Context, reg *vip.Registry, r *http.Request, k vip.PortKey, _ noBody) (vip.ServiceView, error) {
		b, err := reg.ResolveBackend(r.PathValue("backend"))
		if err != nil {
			return vip.ServiceView{}, err
		}
		return reg.BackendDrain(ctx, r.PathValue("vip"), k, b, drain)
	}
}

// drainMark is what `vip show` appends to a draining backend.
func drainMark(l vip.Listener, b vip.Backend) string {
	if l.Draining(b) {
		return "  (drain)"
	}
	return ""
}

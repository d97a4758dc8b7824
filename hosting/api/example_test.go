package api_test

import (
	"log"
	"net/http"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/api"
)

// Mount the API behind bearer tokens; the token's principal is recorded
// in the audit columns of every write.
func Example() {
	var svc *hosting.Service // hosting.NewService(...)
	h, err := api.New(api.Options{Service: svc, BasePath: "/v1"})
	if err != nil {
		log.Fatal(err)
	}
	auth, err := api.NewBearer(map[string]string{"a-long-random-token-for-ops": "ops"})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", auth.Wrap(h))
	_ = http.ListenAndServe("127.0.0.1:8080", mux)
}

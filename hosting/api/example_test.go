package api_test

import (
	"log"
	"net/http"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/api"
)

// Mount the API behind bearer tokens; the token's principal is recorded
// in the audit columns of every write, and its scope bounds the accounts
// it acts on: tenant-1 sees acct-1 alone.
func Example() {
	var svc *hosting.Service // hosting.NewService(...)
	h, err := api.New(api.Options{Service: svc, BasePath: "/v1"})
	if err != nil {
		log.Fatal(err)
	}
	tenant, err := api.AccountScope("acct-1")
	if err != nil {
		log.Fatal(err)
	}
	auth, err := api.NewBearer([]api.Token{
		{Secret: "a-long-random-token-for-ops", Principal: "ops", Scope: api.AllAccounts()},
		{Secret: "another-long-token-for-acct-1", Principal: "tenant-1", Scope: tenant},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", auth.Wrap(h))
	_ = http.ListenAndServe("127.0.0.1:8080", mux)
}

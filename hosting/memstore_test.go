package hosting_test

import (
	"testing"

	"github.com/vipkit/vipkit/hosting"
	"github.com/vipkit/vipkit/hosting/storetest"
)

func TestMemStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) hosting.Store { return hosting.NewMemStore() }, storetest.Options{Iterations: 100})
}
